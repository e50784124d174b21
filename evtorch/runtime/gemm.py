"""Running a fused GEMM: allocate outputs and reduction buffers, resolve kernel arguments, launch.

``run_gemm`` is the Triton backend of ``evt.gemm``. The order of work per call:

1. the generated program for the epilogue (cached by IR hash; sizes and scalar values are arguments);
2. outputs: each stored contiguously over the axes it walks and returned as the view the epilogue returned;
   sums accumulated directly into an output start from zero; other reductions get buffers initialised here
   (users never pre-fill anything);
3. a GEMM config (autotuned on CUDA, cached per GPU/shape bucket/dtypes/layout/epilogue; heuristic otherwise);
4. the GEMM kernel with the fused epilogue, then, if the epilogue has one, the vector-stage kernel.
"""
from __future__ import annotations

import math

import torch

from ..codegen.configs import GemmConfig, candidate_configs, heuristic_config
from ..codegen.program import KERNEL_BASE, build_program
from ..codegen.reductions import buffer_shape
from ..codegen.vector_stage import VBLOCK
from ..ir.layouts import input_axis_strides, make_output
from . import knobs
from .autotune import make_tune_key, pick_config, time_ms
from .gemm_launch import launch_gemm, resolve_config, tma_eligible


# How many candidate configs one tuning run may time (None: autotune's default). Benchmarks that tune many
# epilogues in one bounded run lower it; candidates come best guess first, so a short list keeps the likely
# winners.
MAX_TUNE_CANDIDATES: int | None = None


def _poison_value(dtype: torch.dtype):
    if dtype.is_floating_point:
        return float("nan")
    return True if dtype == torch.bool else -1


class _Call:
    """The tensors of one fused GEMM call and how kernel parameters resolve against them."""

    def __init__(self, ep, prog, A, B, inputs, out_dtype, config_blocks):
        self.ep, self.prog, self.inputs = ep, prog, inputs
        L = A.shape[0] if A.dim() == 3 else 1
        self.sizes = {"L": L, "M": A.shape[-2], "N": B.shape[-1]}
        self.device = A.device
        direct = {r.direct_output for r in prog.epilogue.reductions if r.direct_output is not None}
        present = {n.target for n in ep.graph.outputs}
        poison = knobs.poison_enabled()
        self.outputs = {}
        self.fills = {}  # per output position: what its base was filled with (None: left uninitialised)
        for o in ep.outputs:
            if o.position not in present:
                continue
            dtype = ep.output_dtype(o, out_dtype)
            fill = 0 if o.position in direct else (_poison_value(dtype) if poison else None)
            self.fills[o.position] = fill
            self.outputs[o.position] = make_output(o.dims, self.sizes, dtype, self.device, fill)
        self.block_m, self.block_n = config_blocks
        self.buffers = {}
        self.inits = {}  # per buffer key: its fill (None: uninitialised)
        for r in prog.epilogue.reductions:
            if r.direct_output is not None:
                continue
            shape = buffer_shape(r, self.sizes, self.block_m, self.block_n)
            for part in r.parts():
                init = r.init_value()
                t = torch.empty(shape, dtype=r.buffer_dtype(), device=self.device) if init is None else \
                    torch.full(shape, init, dtype=r.buffer_dtype(), device=self.device)
                self.buffers[(r.rid, part)] = (t, (("T",) if r.mode == "partials" else ()) + r.kept)
                self.inits[(r.rid, part)] = init
        if prog.vector is not None:
            for r in prog.vector.inner:
                shape = [self.sizes[a] for a in r.node.axes]
                for part in r.parts():
                    t = torch.full(shape, r.init_value(part), dtype=r.buffer_dtype(part), device=self.device)
                    self.buffers[(r.rid, part)] = (t, r.node.axes)
                    self.inits[(r.rid, part)] = r.init_value(part)
        self.reductions = {r.rid: r for r in prog.epilogue.reductions}
        if prog.vector is not None:
            self.reductions.update({r.rid: r for r in prog.vector.inner})

    def resolve(self, p):
        kind, key = p.kind, p.key
        if kind == "in_ptr":
            return self.inputs[key]
        if kind == "in_stride":
            name, binding, axis = key
            return input_axis_strides(name, self.inputs[name], binding, self.sizes)[axis]
        if kind == "scalar":
            v = self.inputs[key]
            return int(v) if isinstance(v, bool) else v
        if kind == "out_ptr":
            return self.outputs[key][0]
        if kind == "out_stride":
            pos, axis = key
            base, base_axes, _ = self.outputs[pos]
            return base.stride(base_axes.index(axis))
        if kind == "buf_ptr":
            return self.buffers[key][0]
        if kind == "buf_stride":
            rid, axis = key
            t, axes = next(v for k, v in self.buffers.items() if k[0] == rid)
            return t.stride(axes.index(axis))
        if kind == "count":
            rid, what = key
            r = self.reductions[rid]
            if what == "T":
                return self.buffers[(rid, r.parts()[0])][0].shape[0]
            n = math.prod(self.sizes[a] for a in r.node.attrs["over"])
            return n if what == "n" else (1.0 / n if n else 0.0)
        raise AssertionError(f"unknown parameter kind {kind}")

    def results(self):
        return self.ep.pack({pos: view for pos, (_, _, view) in self.outputs.items()})


def _vector_grid(call: _Call) -> tuple[int] | None:
    """Grid of the vector-stage kernel (None: nothing to launch)."""
    vec = call.prog.vector
    if vec.single_program:
        return (1,)
    # one program per element block of the largest output task
    blocks = [(call.sizes["L"] if "L" in d else 1) * triton_cdiv(math.prod(call.sizes[a] for a in d if a != "L"),
                                                                  VBLOCK) for d in vec.task_domains]
    grid = max(blocks, default=0)
    return (grid,) if grid > 0 else None


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ---------------------------------------------------------------------------------------------------- fast path
# A fused GEMM is often called many times with the same signature (shapes, strides, dtypes) and new tensors.
# Everything that signature fixes is worked out once and remembered: the program of an epilogue object, the
# (resolved) config, output and buffer shapes with their fills, and every stride and count argument. A call then
# only allocates, picks up its tensors and scalars, and launches. The memos are bounded (cleared when full).
_MEMO_LIMIT = 2048
_prog_memo: dict = {}
_config_memo: dict = {}
_layout_memo: dict = {}

_IN, _SCALAR, _OUT, _BUF, _CONST = range(5)


def _remember(memo: dict, key, value):
    if len(memo) >= _MEMO_LIMIT:
        memo.clear()
    memo[key] = value
    return value


def clear_caches() -> None:
    """Forget remembered programs, configs and layouts (tests; after changing tuning knobs mid-process)."""
    _prog_memo.clear()
    _config_memo.clear()
    _layout_memo.clear()


def _program(ep, deterministic: bool):
    key = (id(ep), bool(deterministic))
    hit = _prog_memo.get(key)
    if hit is not None and hit[0] is ep:
        return hit[1]
    return _remember(_prog_memo, key, (ep, build_program(ep, deterministic=deterministic)))[1]


class _Layout:
    """What one call signature fixes, taken from a fully built ``_Call``; ``instantiate`` makes a call's tensors
    and argument lists from it without redoing the layout work."""

    __slots__ = ("ep", "device", "outputs", "buffers", "args", "vec_args", "vec_grid", "sizes")

    def __init__(self, ep, prog, call: _Call):
        self.ep = ep
        self.device = call.device
        self.sizes = (call.sizes["L"], call.sizes["M"], call.sizes["N"])
        self.outputs = [(pos, tuple(base.shape), base.dtype, call.fills[pos], tuple(view.shape), view.stride())
                        for pos, (base, _, view) in call.outputs.items()]
        self.buffers = [(key, tuple(t.shape), t.dtype, call.inits[key]) for key, (t, _) in call.buffers.items()]
        self.args = [self._spec(call, p) for p in prog.epilogue.params.params]
        self.vec_args = self.vec_grid = None
        if prog.vector is not None:
            self.vec_args = [self._spec(call, p) for p in prog.vector.params.params]
            self.vec_grid = _vector_grid(call)

    @staticmethod
    def _spec(call: _Call, p):
        kind = p.kind
        if kind == "in_ptr":
            return (_IN, p.key)
        if kind == "scalar":
            return (_SCALAR, p.key)
        if kind == "out_ptr":
            return (_OUT, p.key)
        if kind == "buf_ptr":
            return (_BUF, p.key)
        return (_CONST, call.resolve(p))  # strides and counts depend only on the signature

    def instantiate(self, inputs: dict):
        """(outputs {pos: (base, view)}, GEMM kernel args, vector-stage args or None) for one call."""
        dev = self.device
        outs = {}
        for pos, shape, dtype, fill, vs, vst in self.outputs:
            base = torch.empty(shape, dtype=dtype, device=dev) if fill is None else \
                torch.full(shape, fill, dtype=dtype, device=dev)
            outs[pos] = (base, base.as_strided(vs, vst))
        bufs = {}
        for key, shape, dtype, init in self.buffers:
            bufs[key] = torch.empty(shape, dtype=dtype, device=dev) if init is None else \
                torch.full(shape, init, dtype=dtype, device=dev)

        def value(spec):
            kind, key = spec
            if kind == _CONST:
                return key
            if kind == _IN:
                return inputs[key]
            if kind == _SCALAR:
                v = inputs[key]
                return int(v) if isinstance(v, bool) else v
            if kind == _OUT:
                return outs[key][0]
            return bufs[key]

        args = [value(s) for s in self.args]
        vec_args = None if self.vec_args is None else [value(s) for s in self.vec_args]
        return outs, args, vec_args


def _layout(ep, prog, A, B, inputs, out_dtype, config: GemmConfig) -> tuple[_Layout, _Call | None]:
    """The layout of this call signature, and the ``_Call`` just built for it on a miss (reuse its tensors)."""
    sig = tuple((k, v.shape, v.stride(), v.dtype) if isinstance(v, torch.Tensor) else (k, type(v))
                for k, v in inputs.items())
    key = (id(ep), prog.key, out_dtype, A.dtype, A.device, A.shape, B.shape, config.BLOCK_M,
           config.epilogue_block_n, knobs.poison_enabled(), sig)
    hit = _layout_memo.get(key)
    if hit is not None and hit.ep is ep:
        return hit, None
    call = _Call(ep, prog, A, B, inputs, out_dtype, (config.BLOCK_M, config.epilogue_block_n))
    return _remember(_layout_memo, key, _Layout(ep, prog, call)), call


class _Result:
    __slots__ = ("ep", "outs")

    def __init__(self, ep, outs):
        self.ep, self.outs = ep, outs

    def results(self):
        return self.ep.pack({pos: view for pos, (_, view) in self.outs.items()})


def _choose_config(ep, prog, A, B, inputs, out_dtype, deterministic, allow_tf32) -> GemmConfig:
    """The config to run (already through ``resolve_config``); on CUDA remembered per call signature."""
    L = A.shape[0] if A.dim() == 3 else 1
    M, N, K = A.shape[-2], B.shape[-1], A.shape[-1]
    if not A.is_cuda:
        return resolve_config(A, B, heuristic_config(M, N, K, A.dtype, A.device, L=L, tma_ok=False))
    memo_key = (prog.key, deterministic, allow_tf32, out_dtype, A.dtype, A.device, A.shape, A.stride(), B.shape,
                B.stride(), A.data_ptr() % 16 == 0, B.data_ptr() % 16 == 0, knobs.autotune_enabled(),
                MAX_TUNE_CANDIDATES, knobs.cache_dir())
    hit = _config_memo.get(memo_key)
    if hit is not None:
        return hit
    tma_ok = tma_eligible(A, B)
    heuristic = heuristic_config(M, N, K, A.dtype, A.device, L=L, tma_ok=tma_ok, allow_tf32=allow_tf32)
    key = make_tune_key(A, B, prog.key[0] + ("det" if deterministic else ""), ("portable", "splitk",
                                                                              "persistent_tma"), (out_dtype,))
    candidates = candidate_configs(M, N, K, A.dtype, A.device, L=L, tma_ok=tma_ok, allow_tf32=allow_tf32)

    def bench(cfg: GemmConfig) -> float:
        return time_ms(lambda: _execute(ep, prog, A, B, inputs, out_dtype, allow_tf32, cfg))

    limit = {} if MAX_TUNE_CANDIDATES is None else {"max_candidates": MAX_TUNE_CANDIDATES}
    best = pick_config(candidates, bench, key=key, heuristic=heuristic, device=A.device, **limit)
    return _remember(_config_memo, memo_key, resolve_config(A, B, best))


def _execute(ep, prog, A, B, inputs, out_dtype, allow_tf32, config: GemmConfig, resolved: bool = False):
    if not resolved:
        config = resolve_config(A, B, config)  # a TMA config on non-TMA-able operands runs as portable
    layout, call = _layout(ep, prog, A, B, inputs, out_dtype, config)
    if call is not None:  # first call of this signature: its tensors are already allocated
        outs = {pos: (base, view) for pos, (base, _, view) in call.outputs.items()}
        args = [call.resolve(p) for p in prog.epilogue.params.params]
        vec_args = None if prog.vector is None else [call.resolve(p) for p in prog.vector.params.params]
    else:
        outs, args, vec_args = layout.instantiate(inputs)
    launch_gemm(prog.module, KERNEL_BASE, A, B, args, config, allow_tf32)
    if vec_args is not None and layout.vec_grid is not None:
        L, M, N = layout.sizes
        getattr(prog.module, prog.vector.fn_name)[layout.vec_grid](L, M, N, *vec_args, VBLOCK=VBLOCK, num_warps=4)
    return _Result(ep, outs)


def run_gemm(ep, A, B, inputs: dict, *, out_dtype, deterministic=False, allow_tf32=False, config=None):
    L = A.shape[0] if A.dim() == 3 else 1
    if A.shape[-2] == 0 or B.shape[-1] == 0 or L == 0:
        # nothing to tile: the reference executor gives correctly shaped empty / identity results
        acc = torch.zeros(ep.acc_shape, dtype=ep.acc_dtype, device=A.device)
        return ep.reference(acc, out_dtype=out_dtype, **inputs)
    prog = _program(ep, deterministic)
    if config is None:
        config = _choose_config(ep, prog, A, B, inputs, out_dtype, deterministic, allow_tf32)
    else:
        config = resolve_config(A, B, config)
    return _execute(ep, prog, A, B, inputs, out_dtype, allow_tf32, config, resolved=True).results()

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

import functools
import math

import torch

from ..codegen.configs import GemmConfig, device_info
from ..codegen.policy import candidate_configs, epilogue_heuristic, for_epilogue, heuristic_config
from ..codegen.program import build_program
from ..codegen.reductions import buffer_shape
from ..codegen.vector_stage import VBLOCK
from ..epilogue import pack_results
from ..ir.layouts import input_axis_strides, make_output
from . import autotune, knobs
from .autotune import interleaved_ms, make_tune_key, pick_config, time_ms
from .gemm_launch import (gemm_problem, install_tma_allocator, narrow_index, pingpong_eligible, prepare_launch,
                          resolve_config, tma_eligible)
from .launcher import arg_key, make_launch


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
            self.outputs[o.position] = make_output(o.dims, self.sizes, dtype, self.device, fill, o.order)
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
# A fused GEMM is often called many times with the same signature (shapes, strides, dtypes, devices) and new
# tensors. Everything that signature fixes is worked out on its first call and kept in a ``_Launch``: the
# program, the (resolved) config, the GEMM launch (``gemm_launch.prepare_launch``: kernels bound to their grids,
# sizes, strides, constexprs), output and buffer shapes with their fills, every stride and count argument, the
# vector-stage launch. A later call builds the signature key, looks it up, allocates, fills in its tensors and
# scalars, and launches. The memos are bounded (cleared when full).
_MEMO_LIMIT = 2048
_prog_memo: dict = {}
_config_memo: dict = {}
_launches: dict = {}

_IN, _SCALAR, _BOOL, _NEW, _FLOAT = range(5)  # _FLOAT: a float scalar (Triton does not specialise floats)

# The knobs a launch depends on, read raw on every call (tests change them at any time)
_environ_get, (_POISON, _AUTOTUNE, _CACHE_DIR, _FAST_MATH) = knobs.raw_reader(
    knobs.POISON, knobs.AUTOTUNE, knobs.CACHE_DIR, knobs.FAST_MATH)


def _remember(memo: dict, key, value):
    if len(memo) >= _MEMO_LIMIT:
        memo.clear()
    memo[key] = value
    return value


def clear_caches() -> None:
    """Forget remembered programs, configs and launches (tests; after changing tuning knobs mid-process)."""
    global _generation
    _prog_memo.clear()
    _config_memo.clear()
    _launches.clear()
    _generation += 1


_generation = 0  # LaunchSites forget their launches when it changes


_fast_capable: dict = {}


def fast_math_mode(A) -> str:
    """The fast-math mode for a GEMM on ``A``'s device (``codegen/fastmath.py``): the ``EVTORCH_FAST_MATH`` knob on
    an NVIDIA GPU of compute capability >= 7.5 (``tanh.approx.f32``), 'never' on CPU, under the interpreter and
    elsewhere."""
    if not A.is_cuda or knobs.interpreter_active():
        return "never"
    index = A.device.index if A.device.index is not None else torch.cuda.current_device()
    ok = _fast_capable.get(index)
    if ok is None:
        ok = _fast_capable[index] = torch.version.hip is None and torch.cuda.get_device_capability(index) >= (7, 5)
    return knobs.fast_math_mode() if ok else "never"


def _program(ep, deterministic: bool, out_dtype=None, mode: str = "never"):
    key = (id(ep), bool(deterministic), out_dtype, mode)
    hit = _prog_memo.get(key)
    if hit is not None and hit[0] is ep:
        return hit[1]
    prog = build_program(ep, deterministic=deterministic, out_dtype=out_dtype, fast_math=mode)
    return _remember(_prog_memo, key, (ep, prog))[1]


def launch_key(ep, A, B, inputs: dict, out_dtype, deterministic, allow_tf32, config) -> tuple:
    """Everything a call's launch depends on: the epilogue object, options, the operands' shapes, strides,
    dtypes, devices and 16-byte alignment (TMA), the inputs' shapes, strides, dtypes and devices (numbers: their
    type; values are arguments), and the knobs read while preparing (poisoning, fast math; on CUDA without a
    config, the tuning knobs)."""
    key = [ep, out_dtype, deterministic, allow_tf32, config, A.shape, A.stride(), A.dtype, A.device,
           A.data_ptr() % 16 == 0, B.shape, B.stride(), B.dtype, B.device, B.data_ptr() % 16 == 0,
           _environ_get(_POISON), _environ_get(_FAST_MATH)]
    if config is None and A.is_cuda:
        key += (_environ_get(_AUTOTUNE), _environ_get(_CACHE_DIR), MAX_TUNE_CANDIDATES)
    for k, v in inputs.items():
        key.append((k, v.shape, v.stride(), v.dtype, v.device) if isinstance(v, torch.Tensor) else (k, type(v)))
    return tuple(key)


def _tma_rows(call: _Call, code, strides: dict, t: torch.Tensor) -> bool:
    """Whether the M x N tensor ``t`` (an epilogue input or output whose {axis: stride parameter} is ``strides``)
    has the rows a TMA descriptor takes: unit stride along N, a positive row pitch of a multiple of 16 bytes."""
    params = {p.name: p for p in code.params.params}
    s_m, s_n = call.resolve(params[strides["M"]]), call.resolve(params[strides["N"]])
    return s_n == 1 and s_m > 0 and (s_m * t.element_size()) % 16 == 0


# Element offsets of the epilogue's tensors along M and N are computed in int32 where they fit (INDEX_DTYPE):
# a 32-bit multiply-add per address instead of 64-bit arithmetic (sm_90 SASS of the ping-pong halves: lincomb_relu
# 3496 -> 3372 instructions, colbcast_leaky 4882 -> 4709).
_INT32_LIMIT = 2 ** 31


def _offsets_fit_int32(params, call: _Call, config: GemmConfig) -> bool:
    """Whether every epilogue tensor's element offset along M and N, ``idx_m * s_M + idx_n * s_N``, stays below
    2^31 over the index range a kernel's tiles reach (padded by two tiles per axis: ragged last tiles, slices past N,
    the ping-pong kernel's prefetch one slice ahead). Batch (L) and workspace-slot (T) offsets are int64 anyway."""
    reach = {"M": call.sizes["M"] + 2 * config.BLOCK_M, "N": call.sizes["N"] + 2 * config.BLOCK_N}
    spans: dict = {}
    for p in params:
        if p.kind in ("in_stride", "out_stride", "buf_stride") and p.key[-1] in reach:
            tensor = (p.kind, p.key[:-1])
            spans[tensor] = spans.get(tensor, 0) + reach[p.key[-1]] * abs(int(call.resolve(p)))
    return all(span < _INT32_LIMIT for span in spans.values())


# The ping-pong kernel's constexprs where the epilogue's one M x N input comes through the TMA loader (EPI_TMA): the
# loader then brings every slice, so no consumer prefetch. A call signature compiles with EPI_TMA off (``gemm_launch``)
# and each call turns it on where that input's base is 16-byte aligned (``_Launch``).
_EPI_TMA_FLAGS = {"EPI_TMA": True, "PREFETCH": 0}


class _Launch:
    """What one call signature fixes, taken from a fully built ``_Call``; ``run`` makes a call's tensors and
    argument lists from it and launches.

    ``run`` is generated Python for the signature (``source``): allocations, the kernel call with its arguments
    spelled out (constants bound, inputs looked up by name), the vector-stage call, the output views. Loops over
    argument descriptions cost more host time than the launch itself at small sizes."""

    __slots__ = ("ep", "config", "device", "gemm", "news", "views", "args", "slots", "vec_fn", "vec_args",
                 "vec_slots", "vec_launch", "pack", "returns", "source", "run_fast", "epi_tma")

    def __init__(self, ep, prog, call: _Call, A, B, config: GemmConfig, allow_tf32: bool):
        self.ep = ep
        self.config = config
        self.device = call.device
        self.gemm = prepare_launch(prog.module, prog.kernel_base, A, B, config, allow_tf32)
        # tensors allocated per call: outputs' bases, then reduction buffers; (shape, dtype, fill)
        self.news = []
        index = {}
        self.views = []  # per output: (position, index of its base, None or (view sizes, strides))
        for pos, (base, _, view) in call.outputs.items():
            index[("out", pos)] = len(self.news)
            self.news.append((tuple(base.shape), base.dtype, call.fills[pos]))
            same = tuple(view.shape) == tuple(base.shape) and view.stride() == base.stride() and \
                view.storage_offset() == base.storage_offset()
            self.views.append((pos, index[("out", pos)], None if same else (tuple(view.shape), view.stride())))
        for key, (t, _) in call.buffers.items():
            index[("buf", key)] = len(self.news)
            self.news.append((tuple(t.shape), t.dtype, call.inits[key]))
        self.args, self.slots = self._specs(call, prog.epilogue.params.params, index)
        self.epi_tma = self._epi_tma_input(prog, call)
        self._check_tma_store(prog, call)
        if self.gemm.mode is not None and _offsets_fit_int32(prog.epilogue.params.params, call, config):
            narrow_index(self.gemm)
        self.vec_fn = self.vec_args = self.vec_slots = self.vec_launch = None
        if prog.vector is not None:
            grid = _vector_grid(call)
            if grid is not None:
                L, M, N = call.sizes["L"], call.sizes["M"], call.sizes["N"]
                fn = getattr(prog.module, prog.vector.fn_name)
                self.vec_launch = (fn, grid, (L, M, N))
                kernel = fn[grid]
                self.vec_fn = lambda *args: kernel(L, M, N, *args, VBLOCK=VBLOCK, num_warps=4)
                self.vec_args, self.vec_slots = self._specs(call, prog.vector.params.params, index)
        where = {pos: i for i, (pos, _, _) in enumerate(self.views)}
        self.pack = [where.get(o.position) for o in ep.outputs]
        self.returns = ep.returns
        self.run_fast = self._generate()

    def _epi_tma_input(self, prog, call: _Call):
        """The input whose tiles the ping-pong kernel may load through its TMA loader (config flag EPI_TMA; the
        epilogue's one M x N input, 16-bit, unit stride along N, 16-byte row pitch), or None. Its base address's
        16-byte alignment is checked per call (the generated ``run``)."""
        code = prog.epilogue
        entry = code.tma_input()
        if self.gemm.mode != "pingpong" or not self.config.flag("EPI_TMA") or entry is None:
            return None
        _, strides, name, dtype = entry
        t = call.inputs[name]
        return name if t.dtype == dtype and _tma_rows(call, code, strides, t) else None

    def _check_tma_store(self, prog, call: _Call) -> None:
        """TMA_STORE (the ping-pong consumers' tile outputs stored by TMA) stays on only where every such output is
        16-bit with a unit N stride and a 16-byte row pitch, and, with the input through the loader, of the input's
        dtype (output 0 takes the input's slice buffer); the bases are fresh allocations (512-byte aligned).
        Otherwise the call runs TMA_STORE = 0, and without the wgmma layout where the epilogue stores tiles (its
        4-byte stores lose 6-40%: docs/benchmarks.md)."""
        common = self.gemm.common
        if self.gemm.mode != "pingpong" or not common.get("TMA_STORE"):
            return
        code = prog.epilogue
        outs = [(call.outputs[pos][0], strides) for _, strides, pos in code.tma_outputs]
        ok = bool(outs) and all(t.dtype in (torch.float16, torch.bfloat16) and _tma_rows(call, code, strides, t)
                                for t, strides in outs)
        if ok and self.epi_tma is not None:
            ok = outs[0][0].dtype == call.inputs[self.epi_tma].dtype
        if not ok:
            common["TMA_STORE"] = 0
            if code.tile_stores:
                common["EPI_MMA"] = False

    @staticmethod
    def _specs(call: _Call, params, index) -> tuple[list, list]:
        """(argument list with the signature's constants, [(slot, kind, key)] filled per call)."""
        args, slots = [], []
        for i, p in enumerate(params):
            kind = p.kind
            if kind == "in_ptr":
                slots.append((i, _IN, p.key))
            elif kind == "scalar":
                v = call.inputs[p.key]
                slots.append((i, _BOOL if isinstance(v, bool) else _FLOAT if type(v) is float else _SCALAR, p.key))
            elif kind == "out_ptr":
                slots.append((i, _NEW, index[("out", p.key)]))
            elif kind == "buf_ptr":
                slots.append((i, _NEW, index[("buf", p.key)]))
            args.append(None if slots and slots[-1][0] == i else call.resolve(p))  # strides, counts: constants
        return args, slots

    def _generate(self):
        """``run(A, B, inputs)`` for this signature, as generated code (see the class doc). Kernels launch through
        ``runtime.launcher``: the call passes the specialisation key of the arguments that vary between calls
        (inputs and scalars; shapes, strides, dtypes and A's and B's alignment are this signature's)."""
        ns = {"_empty": torch.empty, "_full": torch.full, "_dev": self.device, "_int": int, "_ak": arg_key}
        lines = ["def run(A, B, inputs):"]
        for i, (shape, dtype, fill) in enumerate(self.news):
            ns[f"_s{i}"], ns[f"_d{i}"], ns[f"_f{i}"] = shape, dtype, fill
            lines.append(f"    n{i} = _empty(_s{i}, dtype=_d{i}, device=_dev)" if fill is None else
                         f"    n{i} = _full(_s{i}, _f{i}, dtype=_d{i}, device=_dev)")

        def arguments(args, slots, prefix):
            """(argument expressions, the launch key's expression): a value that varies per call is bound to a
            local first, so the key and the argument list read it once."""
            filled = {i: (kind, key) for i, kind, key in slots}
            out, keys = [], []
            for i, value in enumerate(args):
                if i not in filled:
                    if type(value) is int:
                        out.append(repr(value))
                    else:
                        ns[f"{prefix}{i}"] = value
                        out.append(f"{prefix}{i}")
                    continue
                kind, key = filled[i]
                if kind == _NEW:  # fresh allocations: the caching allocator's blocks are 512-byte aligned
                    out.append(f"n{key}")
                    continue
                local = f"{prefix}x{i}"
                lines.append(f"    {local} = inputs[{key!r}]" if kind != _BOOL else f"    {local} = _int(inputs[{key!r}])")
                out.append(local)
                if kind != _FLOAT:
                    keys.append(f"_ak({local})")
            return out, f"({', '.join(keys)},)" if keys else "()"

        gemm = self.gemm
        index = gemm.device_index
        args, key = arguments(self.args, self.slots, "_c")
        splitk = gemm.mode == "splitk" and gemm.workspace_fn is None  # (a caller's workspace: PreparedLaunch)
        if (gemm.jit is not None or splitk) and index is not None:
            # Triton launches on the current device: off A's, run again under a device guard
            # torch.cuda.current_device() without its lazy-init check where torch has the raw call (A is a
            # CUDA tensor, so CUDA is up)
            ns["_device"] = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device
            ns["_guarded"] = self._guarded
            lines.insert(1, f"    if _device() != {index}: return _guarded(A, B, inputs)")
            if gemm.mode in ("persistent_tma", "pingpong") or gemm.common.get("TMA_LOADS"):
                ns["_tma_allocator"] = install_tma_allocator
                lines.append("    _tma_allocator()")
        if splitk:
            # PreparedLaunch's two split-K kernels, spelled out: the partials into a fresh workspace (its base is
            # the allocator's, 512-byte aligned, and A's and B's alignment is this signature's: an empty key),
            # then the reduce kernel with the epilogue's arguments. Through runtime.launcher as the one-kernel
            # templates: Triton's JIT path costs ~30 us of host time a launch, which at 64x1024x8192 made the
            # public call 2-4x the kernels' time (docs/benchmarks.md, "Few rows")
            part_jit, part_grid, reduce_jit, reduce_grid = gemm.splitk_kernels
            tail = gemm.tail
            ns["_ws"], ns["_wd"] = gemm.work_shape, gemm.work_dtype
            ns["_part"] = make_launch(part_jit, part_grid, 2 + len(tail) + 1, gemm.common, index)
            ns["_reduce"] = make_launch(reduce_jit, reduce_grid, 4 + len(args), gemm.reduce_kwargs, index)
            lines.append("    w = _empty(_ws, dtype=_wd, device=_dev)")
            lines.append(f"    _part((), A, B, {', '.join(map(repr, tail))}, w)")
            lines.append(f"    _reduce({key}, w, {tail[0]!r}, {tail[1]!r}, {tail[3]!r}, {', '.join(args)})")
        elif gemm.jit is not None:  # portable, persistent_tma, pingpong: PreparedLaunch's kernel call, spelled out
            positional = 2 + len(gemm.tail) + len(args)
            ns["_kernel"] = make_launch(gemm.jit, gemm.grid, positional, gemm.common, index)
            kernel = "_kernel"
            if self.epi_tma is not None:  # the loader's TMA copies need a 16-byte aligned input base
                ns["_kernel_tma"] = make_launch(gemm.jit, gemm.grid, positional, dict(gemm.common, **_EPI_TMA_FLAGS),
                                                index)
                kernel = f"(_kernel_tma if inputs[{self.epi_tma!r}].data_ptr() % 16 == 0 else _kernel)"
            lines.append(f"    {kernel}({key}, A, B, {', '.join(map(repr, gemm.tail))}, {', '.join(args)})")
        else:
            ns["_gemm"] = gemm
            lines.append(f"    _gemm(A, B, ({', '.join(args)},))" if args else "    _gemm(A, B, ())")
        if self.vec_fn is not None:
            vec_args, vec_key = arguments(self.vec_args, self.vec_slots, "_v")
            fn, grid, sizes = self.vec_launch
            ns["_vec"] = make_launch(fn, grid, len(sizes) + len(vec_args), dict(VBLOCK=VBLOCK, num_warps=4), index)
            lines.append(f"    _vec({vec_key}, {', '.join(map(repr, sizes))}, {', '.join(vec_args)})")
        views = []
        for n, (_, i, v) in enumerate(self.views):
            if v is None:
                views.append(f"n{i}")
            else:
                ns[f"_vs{n}"], ns[f"_vt{n}"] = v
                views.append(f"n{i}.as_strided(_vs{n}, _vt{n})")
        res = [views[i] if i is not None else "None" for i in self.pack]
        lines.append(f"    return [{', '.join(res)}]" if self.returns == "list" else
                     f"    return ({', '.join(res)},)" if self.returns == "tuple" else f"    return {res[0]}")
        self.source = "\n".join(lines) + "\n"
        exec(compile(self.source, f"<evtorch launch {self.ep.name}>", "exec"), ns)
        return ns["run"]

    def _guarded(self, A, B, inputs):
        with torch.cuda.device(self.gemm.device_index):
            return self.run_fast(A, B, inputs)

    def run(self, A, B, inputs: dict, call: _Call | None = None):
        """Allocate, launch, and return the results in the epilogue's return convention."""
        if call is None:
            return self.run_fast(A, B, inputs)
        new = [base for base, _, _ in call.outputs.values()] + [t for t, _ in call.buffers.values()]
        args = self.args.copy()  # first call of this signature: its tensors are already allocated
        for i, kind, key in self.slots:
            args[i] = new[key] if kind == _NEW else inputs[key] if kind != _BOOL else int(inputs[key])
        # the kernel ``run_fast`` would launch: a one-call check (the selftest) must run what later calls run,
        # and the tuner's threaded first calls must compile it
        self.gemm(A, B, args, _EPI_TMA_FLAGS if self.epi_tma is not None and
                  inputs[self.epi_tma].data_ptr() % 16 == 0 else None)
        if self.vec_fn is not None:
            vec_args = self.vec_args.copy()
            for i, kind, key in self.vec_slots:
                vec_args[i] = new[key] if kind == _NEW else inputs[key] if kind != _BOOL else int(inputs[key])
            self.vec_fn(*vec_args)
        views = [new[i] if v is None else new[i].as_strided(*v) for _, i, v in self.views]
        return pack_results([None if i is None else views[i] for i in self.pack], self.returns)


class _Result:
    __slots__ = ("launch", "value")

    def __init__(self, launch, value):
        self.launch, self.value = launch, value

    def results(self):
        return self.value


def _epilogue_traits(prog) -> dict:
    """What the config policy needs to know of generated program ``prog``'s epilogue (``policy.for_epilogue``'s
    keywords): an M x N input the loader can bring, tile stores, TMA-stored outputs, prefetched inputs,
    reductions."""
    code = prog.epilogue
    return dict(tma_input=code.tma_input() is not None, tile_stores=code.tile_stores,
                tma_outputs=len(code.tma_outputs), tile_inputs=code.prefetch, reductions=bool(code.reductions))


def candidates_for_program(prog, candidates: list[GemmConfig], dtype: torch.dtype, info) -> list[GemmConfig]:
    """``candidates`` as the epilogue of generated program ``prog`` can use them (``policy.for_epilogue``). The
    tuner's list, and ``evtorch configs --epilogue``'s."""
    return for_epilogue(candidates, dtype=dtype, info=info, **_epilogue_traits(prog))


def heuristic_for_program(prog, heuristic: GemmConfig, N: int, K: int, dtype: torch.dtype, info) -> GemmConfig:
    """The heuristic config as the epilogue of ``prog`` runs it at this N and K (``policy.epilogue_heuristic``):
    what a call launches without tuning, and the tuner's fallback."""
    return epilogue_heuristic(heuristic, N, K, dtype=dtype, info=info, tile_ops=prog.epilogue.tile_ops,
                              **_epilogue_traits(prog))


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
    info = device_info(A.device)
    heuristic = heuristic_for_program(
        prog, heuristic_config(M, N, K, A.dtype, A.device, L=L, tma_ok=tma_ok, allow_tf32=allow_tf32,
                               pingpong_ok=pingpong_eligible(A, B)), N, K, A.dtype, info)
    key = make_tune_key(A, B, prog.tune_hash + ("det" if deterministic else ""), prog.key[4], (out_dtype,))
    candidates = candidate_configs(M, N, K, A.dtype, A.device, L=L, tma_ok=tma_ok, allow_tf32=allow_tf32)
    candidates = candidates_for_program(prog, candidates, A.dtype, info)

    def bench(cfg: GemmConfig) -> float:
        return time_ms(lambda: _execute(ep, prog, A, B, inputs, out_dtype, allow_tf32, cfg), graph="auto")

    def prepare(cfg: GemmConfig) -> None:  # compiles the candidate's kernels (pick_config runs these in threads)
        _execute(ep, prog, A, B, inputs, out_dtype, allow_tf32, cfg)

    def load():  # cuBLAS's product: the GPU's load while the candidates compile (autotune.LOAD_GRAPH_MS), and
        return torch.matmul(A, B)  # what each finalist's timing follows (autotune.FINAL_BETWEEN)

    def final(cfgs):  # the finalists in interleaved rounds, as the bench compares functions (autotune.FINAL_*)
        return interleaved_ms({cfg: functools.partial(prepare, cfg) for cfg in cfgs}, graph="auto",
                              settle_ms=autotune.FINAL_SETTLE_MS, between=load if autotune.FINAL_BETWEEN else None)

    limit = {} if MAX_TUNE_CANDIDATES is None else {"max_candidates": MAX_TUNE_CANDIDATES}
    label = f"{ep.name} at {'x'.join(map(str, (M, N, K)))}" + (f" L={L}" if A.dim() == 3 else "")

    best = pick_config(candidates, bench, key=key, heuristic=heuristic, device=A.device, prepare=prepare,
                       label=label, final=final, load=load, **limit)
    return _remember(_config_memo, memo_key, resolve_config(A, B, best))


def _execute(ep, prog, A, B, inputs, out_dtype, allow_tf32, config: GemmConfig, resolved: bool = False):
    """Run ``ep`` with ``config`` (its launch built on the first call of this signature and config)."""
    if not resolved:
        config = resolve_config(A, B, config)  # a TMA config on non-TMA-able operands runs as portable
    key = launch_key(ep, A, B, inputs, out_dtype, prog.key[2], allow_tf32, config)
    launch = _launches.get(key)
    if launch is not None and launch.config == config:
        return _Result(launch, launch.run(A, B, inputs))
    p = gemm_problem(A, B)
    tile = config.epilogue_tile(p.M, p.N, p.L, device_info(A.device).num_sms)
    call = _Call(ep, prog, A, B, inputs, out_dtype, tile)
    launch = _remember(_launches, key, _Launch(ep, prog, call, A, B, config, allow_tf32))
    try:
        return _Result(launch, launch.run(A, B, inputs, call))  # the first run compiles the kernels
    except Exception as exc:
        from triton.runtime.errors import OutOfResources  # the launch ran, so Triton is there

        if not isinstance(exc, OutOfResources):
            raise
        _launches.pop(key, None)
        raise ValueError(
            f"config={config!r} does not fit this GPU for {A.dtype} operands: {exc} The tuner's candidates and "
            "the heuristic are sized per dtype and device (evtorch.codegen.policy.candidate_configs); a forced "
            "config needs fewer num_stages or smaller BLOCK_M / BLOCK_N / BLOCK_K") from exc


#: ``hook(config)`` for each, when a call signature's launch is first prepared (benchmarks/run.py records the tuned
#: config this way); repeated calls take the cached launch and call none of them
FIRST_CALL_HOOKS: list = []


def run_gemm(ep, A, B, inputs: dict, *, out_dtype, deterministic=False, allow_tf32=False, config=None):
    key = launch_key(ep, A, B, inputs, out_dtype, deterministic, allow_tf32, config)
    launch = _launches.get(key)
    if launch is not None:
        return launch.run_fast(A, B, inputs)
    return _first_call(key, ep, A, B, inputs, out_dtype, deterministic, allow_tf32, config)


def run_cached(key: tuple, A, B, inputs: dict):
    """The results of a call whose ``launch_key`` is ``key`` if that signature has run before, else None."""
    launch = _launches.get(key)
    if launch is None:
        return None
    return launch.run_fast(A, B, inputs)


class LaunchSite:
    """One place in a caller that runs an epilogue on operands and inputs whose shapes, strides, dtypes and
    devices the caller's own cache key already fixes (``evt.linear``'s forward for one call signature). It
    remembers the launch per what is left to vary (A's and B's 16-byte alignment, the knobs), so a call costs a
    small key instead of ``launch_key``. ``run`` returns None when the signature has not run yet (the caller then
    takes its checked path, which prepares the launch)."""

    __slots__ = ("memo", "generation")

    def __init__(self):
        self.memo: dict = {}
        self.generation = _generation

    def run(self, ep, A, B, inputs: dict, out_dtype, deterministic, allow_tf32, config):
        if self.generation != _generation:
            self.memo.clear()
            self.generation = _generation
        token = (A.data_ptr() % 16 == 0, B.data_ptr() % 16 == 0, _environ_get(_POISON), _environ_get(_AUTOTUNE),
                 _environ_get(_CACHE_DIR), MAX_TUNE_CANDIDATES, _environ_get(_FAST_MATH))
        launch = self.memo.get(token)
        if launch is None:
            launch = _launches.get(launch_key(ep, A, B, inputs, out_dtype, deterministic, allow_tf32, config))
            if launch is None:
                return None
            if len(self.memo) >= 16:
                self.memo.clear()
            self.memo[token] = launch
        return launch.run_fast(A, B, inputs)


def _first_call(key, ep, A, B, inputs, out_dtype, deterministic, allow_tf32, config):
    L = A.shape[0] if A.dim() == 3 else 1
    if A.shape[-2] == 0 or B.shape[-1] == 0 or L == 0:
        # nothing to tile: the reference executor gives correctly shaped empty / identity results
        acc = torch.zeros(ep.acc_shape, dtype=ep.acc_dtype, device=A.device)
        return ep.reference(acc, out_dtype=out_dtype, **inputs)
    prog = _program(ep, deterministic, out_dtype, fast_math_mode(A))
    if config is None:
        config = _choose_config(ep, prog, A, B, inputs, out_dtype, deterministic, allow_tf32)
    else:
        config = resolve_config(A, B, config)
    res = _execute(ep, prog, A, B, inputs, out_dtype, allow_tf32, config, resolved=True)
    _remember(_launches, key, res.launch)
    for hook in FIRST_CALL_HOOKS:
        hook(config)
    return res.results()

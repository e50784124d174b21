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
        for o in ep.outputs:
            if o.position not in present:
                continue
            dtype = ep.output_dtype(o, out_dtype)
            fill = 0 if o.position in direct else (_poison_value(dtype) if poison else None)
            self.outputs[o.position] = make_output(o.dims, self.sizes, dtype, self.device, fill)
        self.block_m, self.block_n = config_blocks
        self.buffers = {}
        for r in prog.epilogue.reductions:
            if r.direct_output is not None:
                continue
            shape = buffer_shape(r, self.sizes, self.block_m, self.block_n)
            for part in r.parts():
                init = r.init_value()
                t = torch.empty(shape, dtype=r.buffer_dtype(), device=self.device) if init is None else \
                    torch.full(shape, init, dtype=r.buffer_dtype(), device=self.device)
                self.buffers[(r.rid, part)] = (t, (("T",) if r.mode == "partials" else ()) + r.kept)
        if prog.vector is not None:
            for r in prog.vector.inner:
                shape = [self.sizes[a] for a in r.node.axes]
                for part in r.parts():
                    t = torch.full(shape, r.init_value(part), dtype=r.buffer_dtype(part), device=self.device)
                    self.buffers[(r.rid, part)] = (t, r.node.axes)
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


def _launch_vector(call: _Call) -> None:
    vec = call.prog.vector
    args = [call.resolve(p) for p in vec.params.params]
    kernel = getattr(call.prog.module, vec.fn_name)
    if vec.single_program:
        grid = (1,)
    else:  # one program per element block of the largest output task
        blocks = [(call.sizes["L"] if "L" in d else 1) * triton_cdiv(math.prod(call.sizes[a] for a in d if a != "L"),
                                                                      VBLOCK) for d in vec.task_domains]
        grid = (max(blocks, default=0),)
        if grid[0] == 0:
            return
    s = call.sizes
    kernel[grid](s["L"], s["M"], s["N"], *args, VBLOCK=VBLOCK, num_warps=4)


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _choose_config(ep, prog, A, B, inputs, out_dtype, deterministic, allow_tf32) -> GemmConfig:
    L = A.shape[0] if A.dim() == 3 else 1
    M, N, K = A.shape[-2], B.shape[-1], A.shape[-1]
    tma_ok = tma_eligible(A, B) if A.is_cuda else False
    heuristic = heuristic_config(M, N, K, A.dtype, A.device, L=L, tma_ok=tma_ok, allow_tf32=allow_tf32)
    if not A.is_cuda:
        return heuristic
    key = make_tune_key(A, B, prog.key[0] + ("det" if deterministic else ""), ("portable", "splitk",
                                                                              "persistent_tma"), (out_dtype,))
    candidates = candidate_configs(M, N, K, A.dtype, A.device, L=L, tma_ok=tma_ok, allow_tf32=allow_tf32)

    def bench(cfg: GemmConfig) -> float:
        return time_ms(lambda: _execute(ep, prog, A, B, inputs, out_dtype, allow_tf32, cfg))

    return pick_config(candidates, bench, key=key, heuristic=heuristic, device=A.device)


def _execute(ep, prog, A, B, inputs, out_dtype, allow_tf32, config: GemmConfig):
    config = resolve_config(A, B, config)  # a TMA config on non-TMA-able operands runs as portable
    call = _Call(ep, prog, A, B, inputs, out_dtype, (config.BLOCK_M, config.epilogue_block_n))
    args = [call.resolve(p) for p in prog.epilogue.params.params]
    launch_gemm(prog.module, KERNEL_BASE, A, B, args, config, allow_tf32)
    if prog.vector is not None:
        _launch_vector(call)
    return call


def run_gemm(ep, A, B, inputs: dict, *, out_dtype, deterministic=False, allow_tf32=False, config=None):
    L = A.shape[0] if A.dim() == 3 else 1
    if A.shape[-2] == 0 or B.shape[-1] == 0 or L == 0:
        # nothing to tile: the reference executor gives correctly shaped empty / identity results
        acc = torch.zeros(ep.acc_shape, dtype=ep.acc_dtype, device=A.device)
        return ep.reference(acc, out_dtype=out_dtype, **inputs)
    prog = build_program(ep, deterministic=deterministic)
    if config is None:
        config = _choose_config(ep, prog, A, B, inputs, out_dtype, deterministic, allow_tf32)
    return _execute(ep, prog, A, B, inputs, out_dtype, allow_tf32, config).results()

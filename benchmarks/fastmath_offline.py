"""Compile the benchmark workloads' fused GEMM kernels for sm_90 offline (no GPU; Triton's bundled ptxas) in the
accurate and the fast-math emission and count what the epilogue costs in SASS: instructions, MUFU ops, registers,
spills. For predictions before a device run (docs/benchmarks.md, "Fast math"), and to check that the Gluon
ping-pong template compiles with the installed Triton (tests/test_pingpong.py).

    python -m benchmarks.fastmath_offline [--workloads a,b] [--config base|q4flat|pp_h|pp_q4_p0|...] [--modes auto]
                                          [--ragged] [--json FILE]

Runs with TRITON_INTERPRET unset. Stride arguments are compiled as at a launch on contiguous tensors: the
innermost stride of every epilogue tensor (and of row-major A and B) is the constant 1, which Triton specialises at
launch and which lets loads and stores of 16-bit tiles vectorize; the others are i32 multiples of 16 (as for the
benchmark shapes).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

if __name__ == "__main__":  # the real compiler, not the interpreter (an importing test process keeps its own)
    os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from evtorch.codegen.policy import DEEP_RING_STAGES  # noqa: E402

PTR = {torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float64: "*fp64",
       torch.int32: "*i32", torch.int64: "*i64", torch.bool: "*i1", torch.uint8: "*u8", torch.int8: "*i8"}
CONFIGS = {"base": dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8, num_stages=3, EPILOGUE_SUBTILE=2,
                        FLATTEN=False),
           "q4flat": dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8, num_stages=3, EPILOGUE_SUBTILE=4,
                          FLATTEN=True)}
# the Gluon ping-pong template's constexprs (launched with num_warps=4, maxnreg=gluon_template.MAXNREG)
PINGPONG_CONFIGS = {f"pp_{name}": dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, STAGES=5 - tma, EPILOGUE_SUBTILE=sub,
                                       PREFETCH=pf, EPI_TMA=bool(tma))
                    for name, sub, pf, tma in (("h", 2, 1, 0), ("h_p0", 2, 0, 0), ("q4", 4, 1, 0), ("q4_p0", 4, 0, 0),
                                               ("h_tma", 2, 0, 1), ("q4_tma", 4, 0, 1))}
# the consumers' epilogue as a loop over slices read from shared memory (EPI_SMEM tile buffers)
PINGPONG_CONFIGS.update({f"pp_{name}": dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, STAGES=stages, EPILOGUE_SUBTILE=sub,
                                            PREFETCH=pf, EPI_TMA=False, EPI_SMEM=bufs)
                         for name, stages, sub, pf, bufs in (("es1_q4", 4, 4, 1, 1), ("es1_q4_p0", 4, 4, 0, 1),
                                                             ("es2_q4", 4, 4, 1, 2), ("es1_h", 4, 2, 1, 1),
                                                             ("es1_s8", 4, 8, 1, 1), ("es1_s8_p0", 4, 8, 0, 1),
                                                             ("es2_s8", 4, 8, 1, 2),
                                                             ("es2_h", 4, 2, 1, 2))})
# three consumer warpgroups (CONSUMERS = 3, launched with maxnreg=MAXNREG3): epilogue from registers or through a
# half-tile buffer per consumer (EPI_SMEM = 2)
PINGPONG_CONFIGS.update({f"pp3_{name}": dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, STAGES=stages, EPILOGUE_SUBTILE=sub,
                                             PREFETCH=pf, EPI_TMA=False, EPI_SMEM=bufs, CONSUMERS=3)
                         for name, stages, sub, pf, bufs in (("h", 4, 2, 1, 0), ("q4", 4, 4, 1, 0), ("q4_p0", 4, 4, 0, 0),
                                                             ("es2_h", 3, 2, 1, 2), ("es2_q4", 3, 4, 1, 2),
                                                             ("es2_s8", 3, 8, 1, 2), ("es2_q4_p0", 3, 4, 0, 2),
                                                             ("es1_h", 3, 2, 1, 1), ("es1_q4", 3, 4, 1, 1),
                                                             ("es1_q4_p0", 3, 4, 0, 1), ("es1_s8", 3, 8, 1, 1),
                                                             ("es1_h_p0", 3, 2, 0, 1))})
# the epilogue-warpgroup schedule (EPI_WG = hand-off slots), launched with num_warps=4, maxnreg=MAXNREG_WG
PINGPONG_CONFIGS.update({f"wg_{name}": dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, STAGES=stages,
                                            EPILOGUE_SUBTILE=sub, PREFETCH=pf, EPI_TMA=False, EPI_WG=slots)
                         for name, stages, sub, pf, slots in (("q4", 3, 4, 1, 2), ("q4_p0", 3, 4, 0, 2),
                                                              ("q4_s2r3", 2, 4, 1, 3))})
# consumers of two warpgroups (launched with num_warps=8, maxnreg=MAXNREG8): each thread holds half as many
# accumulator values, and each scheduler runs two warps of the epilogue
PINGPONG_CONFIGS.update({f"pp8_{name}": dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, STAGES=stages, EPILOGUE_SUBTILE=sub,
                                             PREFETCH=pf, EPI_TMA=bool(tma), EPI_SMEM=es, num_warps=8)
                         for name, stages, sub, pf, tma, es in (("h", 5, 2, 1, 0, 0), ("h_p0", 5, 2, 0, 0, 0),
                                                                ("q4", 5, 4, 1, 0, 0), ("q4_p0", 5, 4, 0, 0, 0),
                                                                ("h_tma", 4, 2, 0, 1, 0), ("q4_tma", 4, 4, 0, 1, 0),
                                                                ("es1_h", 4, 2, 1, 0, 1), ("es1_q4", 4, 4, 1, 0, 1))})

# the consumers' epilogue as a runtime loop over slices carried in registers (EPI_LOOP)
PINGPONG_CONFIGS.update({f"pp{'8' if w == 8 else ''}_el_{name}": dict(
    BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, STAGES=5 - tma, EPILOGUE_SUBTILE=sub, PREFETCH=pf, EPI_TMA=bool(tma),
    EPI_LOOP=True, num_warps=w)
    for w in (4, 8) for name, sub, pf, tma in (("h", 2, 1, 0), ("h_p0", 2, 0, 0), ("q4", 4, 1, 0), ("q4_p0", 4, 0, 0),
                                               ("h_tma", 2, 0, 1), ("q4_tma", 4, 0, 1))})

# the halves from registers on a sixth ring stage (policy.DEEP_RING_STAGES: the tuner's short-K candidate)
PINGPONG_CONFIGS["pp_h_s6"] = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, STAGES=DEEP_RING_STAGES, EPILOGUE_SUBTILE=2,
                                   PREFETCH=1, EPI_TMA=False)

# the consumers' epilogue in the accumulator's wgmma layout (EPI_MMA)
PINGPONG_CONFIGS.update({f"pp_mma_{name}": dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, STAGES=5 - tma,
                                                EPILOGUE_SUBTILE=sub, PREFETCH=pf, EPI_TMA=bool(tma), EPI_MMA=True)
                         for name, sub, pf, tma in (("h", 2, 1, 0), ("h_p0", 2, 0, 0), ("h_tma", 2, 0, 1),
                                                   ("q4", 4, 1, 0), ("q4_tma", 4, 0, 1))})

# the consumers' tile outputs stored by TMA from shared buffers (TMA_STORE = the epilogue's count of M x N outputs,
# set per workload in compile_workload), in the wgmma layout or not
PINGPONG_CONFIGS.update({f"pp_{name}": dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, STAGES=stages, EPILOGUE_SUBTILE=sub,
                                            PREFETCH=pf, EPI_TMA=bool(tma), EPI_MMA=mma, TMA_STORE=True)
                         for name, stages, sub, pf, tma, mma in (("ts_h", 4, 2, 1, 0, False),
                                                                 ("mma_ts_h", 4, 2, 1, 0, True),
                                                                 ("mma_ts_h_tma", 4, 2, 0, 1, True),
                                                                 ("mma_ts_q4", 5, 4, 0, 0, True),
                                                                 ("mma_ts_q4_tma", 4, 4, 0, 1, True))})

# the same in a runtime loop over the register-carried slices (EPI_LOOP): one slice's epilogue code per consumer
PINGPONG_CONFIGS.update({f"pp_mma_el_{name[len('pp_mma_'):]}": dict(PINGPONG_CONFIGS[name], EPI_LOOP=True)
                         for name in ("pp_mma_h_tma", "pp_mma_q4_tma", "pp_mma_ts_h_tma", "pp_mma_ts_q4_tma")})


def _tool(name):
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def sass_stats(cubin: bytes) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([_tool("cuobjdump"), "--dump-sass", f.name], capture_output=True, text=True).stdout
        res = subprocess.run([_tool("cuobjdump"), "--dump-resource-usage", f.name], capture_output=True,
                             text=True).stdout
    ins = [re.sub(r"^\s+/\*[0-9a-f]+\*/\s+", "", line) for line in sass.splitlines()
           if re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+\S", line)]
    ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", i).split()[0].rstrip(";").split(".")[0] for i in ins)
    ops.pop("NOP", None)
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", res)
    return {"instructions": sum(ops.values()), "mufu": ops.get("MUFU", 0),
            "mufu_kinds": dict(collections.Counter(re.search(r"MUFU\.(\w+)", i).group(1) for i in ins
                                                   if "MUFU." in i)),
            "regs": int(m.group(1)) if m else None, "stack": int(m.group(2)) if m else None}


_STRIDE_KINDS = ("in_stride", "out_stride", "buf_stride")
_AXIS_ORDER = {"T": 0, "L": 1, "M": 2, "N": 3}  # a partials buffer is [T, kept...]; tensors are (L, M, N)


def unit_strides(params) -> list[str]:
    """The stride parameters equal to 1 for contiguous tensors: per tensor, the one of its innermost axis."""
    owners: dict = {}
    for p in params.params:
        if p.kind in _STRIDE_KINDS:
            owners.setdefault((p.kind, p.key[:-1]), []).append((_AXIS_ORDER[p.key[-1]], p.name))
    return [max(axes)[1] for axes in owners.values()]


def _signature(prog, ep, inputs) -> dict:
    """Kernel argument types of ``prog``'s GEMM kernels for bf16 operands and ``inputs`` (``unit_strides`` and
    row-major A / B's inner strides excluded: those are constexprs)."""
    sig = {"A_ptr": "*bf16", "B_ptr": "*bf16"}
    for s in ("M", "N", "K", "L", "stride_al", "stride_am", "stride_ak", "stride_bl", "stride_bk", "stride_bn"):
        sig[s] = "constexpr" if s in ("stride_ak", "stride_bn") else "i32"
    outs = {o.position: ep.output_dtype(o, torch.bfloat16) for o in ep.outputs}
    bufs = {(r.rid, p): r.buffer_dtype() for r in prog.epilogue.reductions for p in r.parts()}
    for p in prog.epilogue.params.params:
        if p.kind == "in_ptr":
            sig[p.name] = PTR[inputs[p.key].dtype]
        elif p.kind == "scalar":
            sig[p.name] = "fp32" if isinstance(inputs[p.key], float) else "i32"
        elif p.kind == "out_ptr":
            sig[p.name] = PTR[outs[p.key]]
        elif p.kind == "buf_ptr":
            sig[p.name] = PTR[bufs[p.key]]
        elif p.kind == "count" and p.key[1] == "inv":
            sig[p.name] = "fp32"
        else:
            sig[p.name] = "i32"
    for name in unit_strides(prog.epilogue.params):
        sig[name] = "constexpr"
    return sig


def compile_workload(name: str, mode: str, config: str, out_dtype=torch.bfloat16, even: bool = True) -> dict:
    """Compile workload ``name``'s kernel for ``config`` (a CONFIGS key: persistent_tma, or PINGPONG_CONFIGS: the
    Gluon ping-pong template) in fast-math ``mode`` for sm_90; SASS statistics. ``even``: M and N multiples of the
    tile (EVEN_M / EVEN_N, as at the benchmark shapes: no bounds masks), or not (a ragged launch's kernel)."""
    from benchmarks.pingpong_check import workload
    from evtorch.api import get_epilogue
    from evtorch.codegen.fastmath import plan
    from evtorch.codegen.program import build_program
    from evtorch.codegen.gemm_template import kernel_symbol

    fn, mk = workload(name)
    M, N = 256, 512
    inputs = mk(M, N, "cpu", torch.bfloat16)
    ep = get_epilogue(fn, (M, N), torch.float32, inputs)
    prog = build_program(ep, out_dtype=out_dtype, fast_math=mode)
    graph, emissions = plan(ep, out_dtype, mode)  # the graph the program is emitted from
    fast = [graph.nodes[i].target for i in sorted(emissions.fast)]
    sig = _signature(prog, ep, inputs)
    base = dict(GROUP_M=8, ALLOW_TF32=False, ACC_DTYPE=triton.language.float32, DOT_UPCAST=False, NUM_PROGRAMS=132,
                EVEN_M=even, EVEN_N=even, INDEX_DTYPE=triton.language.int32,
                stride_ak=1, stride_bn=1, **{name: 1 for name in unit_strides(prog.epilogue.params)})
    if config in PINGPONG_CONFIGS:
        from triton.experimental.gluon._runtime import GluonASTSource

        from evtorch.codegen.configs import PINGPONG_KERNEL_DEFAULTS
        from evtorch.codegen.gluon_template import launch_maxnreg

        kern = getattr(prog.module, kernel_symbol(prog.kernel_base, "pingpong"))
        consts = dict(base, B_COL_MAJOR=False, **{**PINGPONG_KERNEL_DEFAULTS, **PINGPONG_CONFIGS[config]})
        if consts["TMA_STORE"] is True:
            consts["TMA_STORE"] = len(prog.epilogue.tma_outputs)
        warps = consts.pop("num_warps", 4)
        options = {"num_warps": warps, "maxnreg": launch_maxnreg(consts["EPI_WG"], consts["CONSUMERS"], warps)}
        source = GluonASTSource
    else:
        cfg = CONFIGS[config]
        kern = getattr(prog.module, kernel_symbol(prog.kernel_base, "persistent_tma"))
        consts = dict(base, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
                      A_COL_MAJOR=False, B_COL_MAJOR=False, A_BATCHED=False, B_BATCHED=False,
                      EPILOGUE_SUBTILE=cfg["EPILOGUE_SUBTILE"], WARP_SPECIALIZE=False, FLATTEN=cfg["FLATTEN"],
                      PREFETCH=cfg.get("PREFETCH", 0))
        options = {"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]}
        source = ASTSource
    for k in consts:
        sig[k] = "constexpr"
    # as at a launch on the benchmark shapes: pointers 16-byte aligned, every integer argument a multiple of 16
    attrs = {(i,): [["tt.divisibility", 16]] for i, t in enumerate(sig.values()) if t.startswith("*") or t == "i32"}
    c = triton.compile(source(kern, signature=sig, constexprs=consts, attrs=attrs), target=GPUTarget("cuda", 90, 32),
                       options=options)
    st = sass_stats(c.asm["cubin"])
    st.update(workload=name, mode=mode, config=config, fast_nodes=fast, program=prog.key[0],
              exact_nodes=[graph.nodes[i].target for i in sorted(emissions.exact)],
              shared=c.metadata.shared, even=even)
    return st


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", default="identity,bias_gelu_aux,rowreduce_tanh,dgelu_bgrad,bce_loss")
    ap.add_argument("--config", default="base", help=f"one of {sorted(CONFIGS) + sorted(PINGPONG_CONFIGS)}")
    ap.add_argument("--modes", default="never,auto,always")
    ap.add_argument("--ragged", action="store_true",
                    help="compile as for M, N not multiples of the tile (bounds masks kept: EVEN_M = EVEN_N = False)")
    ap.add_argument("--json")
    args = ap.parse_args()
    os.environ.setdefault("EVTORCH_CACHE_DIR", "/tmp/evtorch_fastmath_offline")
    rows = []
    for name in args.workloads.split(","):
        for mode in args.modes.split(","):
            st = compile_workload(name, mode, args.config, even=not args.ragged)
            if rows and rows[-1]["workload"] == name and any(r["program"] == st["program"] for r in rows
                                                           if r["workload"] == name):
                continue
            rows.append(st)
            print(f"{name:15s} {mode:6s} {st['instructions']:6d} SASS instr, MUFU {st['mufu_kinds']}, "
                  f"regs {st['regs']}, stack {st['stack']}, shared {st['shared']}, fast {st['fast_nodes']}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

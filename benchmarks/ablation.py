"""Where a heavy epilogue's time goes: the benchmark epilogues taken apart, each part timed on the same ping-pong
config in one process and one device call:

    PYTHONUNBUFFERED=1 python -m benchmarks.ablation --out $OUT [--shapes 8192x4096x1024] [--families gelu,mixed]
                                                     [--members a,b] [--configs regs,mma,tma,smem] [--rounds 3]
                                                     [--ab NAME=VALUE]

A *family* is one workload of ``evtorch bench`` and epilogues that each keep part of it: the same loads without
the math, the math without one output, one reduction and not the other, ... (``FAMILIES``). Every member runs on
the same forced configs (``configs_for``: the ping-pong halves from registers in the blocked layout, in the wgmma
layout with the tile outputs stored by TMA, and so on), so the difference between two members is what the part
between them costs in that schedule. Per shape: one poisoned call of every (member, config) against the fp32
reference; then each family's members, captured in CUDA graphs, timed in ``--rounds`` interleaved rounds with
cuBLAS and the identity epilogue (``Harness.paired``: settled first, do_bench medians with L2 flushed). Writes ablation.json and
ablation_log.txt under --out: per member its time, time / cuBLAS, and microseconds per output tile and SM over
the identity (``(t - t_identity) / (tiles / SMs)``: what one tile's epilogue adds beyond the plain store).
``--ab NAME=VALUE`` also times every member under that environment setting (variant B: a codegen knob or a
prototype's switch), its own kernels compiled and captured, in the same rounds as variant A.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.workloads import WORKLOADS, gelu_tanh_derivative  # noqa: E402

T0 = time.time()


def _vec(n, device, dtype):
    return torch.randn(n, device=device, dtype=dtype)


def _mats(*names):
    return lambda M, N, device, dtype: {k: torch.randn(M, N, device=device, dtype=dtype) for k in names}


def _bias(M, N, device, dtype):
    return {"bias": _vec(N, device, dtype)}


# --------------------------------------------------------------------------------------------- the members
def g_bias(acc, bias):
    return acc + bias


def g_gelu(acc, bias):
    return F.gelu(acc + bias, approximate="tanh")


def g_two_stores(acc, bias):
    pre = acc + bias
    return pre * 0.5, pre


def g_full(acc, bias):
    pre = acc + bias
    return F.gelu(pre, approximate="tanh"), pre


def m_one_input(acc, C, alpha, beta):
    return alpha * acc + beta * C


def m_two_inputs(acc, C, aux, alpha, beta):
    return alpha * acc + (beta * C + aux)


def _m_body(acc, C, aux, cbias, rbias, alpha, beta):
    F_ = alpha * acc + (beta * C + aux)
    E = torch.relu(F_ + 1) + cbias[:, None] + rbias
    return F_, E


def m_no_reductions(acc, C, aux, cbias, rbias, alpha, beta):
    F_, E = _m_body(acc, C, aux, cbias, rbias, alpha, beta)
    return E + F_, F_


def m_col_max(acc, C, aux, cbias, rbias, alpha, beta):
    F_, E = _m_body(acc, C, aux, cbias, rbias, alpha, beta)
    return E + F_, F_, F_.amax(dim=0)


def m_row_max(acc, C, aux, cbias, rbias, alpha, beta):
    F_, E = _m_body(acc, C, aux, cbias, rbias, alpha, beta)
    return E + F_, F_, E.amax(dim=1)


def m_full(acc, C, aux, cbias, rbias, alpha, beta):
    F_, E = _m_body(acc, C, aux, cbias, rbias, alpha, beta)
    return E + F_, F_, F_.amax(dim=0), E.amax(dim=1)


def d_product(acc, pre):
    return acc * pre


def d_product_sum(acc, pre):
    dpre = acc * pre
    return dpre, dpre.sum(dim=0)


def d_derivative(acc, pre):
    return acc * gelu_tanh_derivative(pre)


def d_full(acc, pre):
    dpre = acc * gelu_tanh_derivative(pre)
    return dpre, dpre.sum(dim=0)


def r_no_tanh(acc, C, alpha, beta):
    D = alpha * acc + beta * C
    return D, D.sum(dim=1)


def r_no_sum(acc, C, alpha, beta):
    return alpha * acc + torch.tanh(beta * C)


def r_full(acc, C, alpha, beta):
    D = alpha * acc + torch.tanh(beta * C)
    return D, D.sum(dim=1)


_SCALARS = dict(alpha=1.5, beta=-0.5)
FAMILIES: dict[str, list[tuple[str, object, object]]] = {
    # bias_gelu_aux: bias (N,), gelu, two tile stores
    "gelu": [(name, fn, _bias) for name, fn in (("bias_store", g_bias), ("bias_two_stores", g_two_stores),
                                                 ("gelu_one_store", g_gelu), ("bias_gelu_aux", g_full))],
    # mixed_dag: two M x N inputs, two tile stores, a max over M and one over N
    "mixed": [("one_input", m_one_input, lambda M, N, d, t: {**_mats("C")(M, N, d, t), **_SCALARS}),
              ("two_inputs", m_two_inputs, lambda M, N, d, t: {**_mats("C", "aux")(M, N, d, t), **_SCALARS}),
              *[(name, fn, lambda M, N, d, t: {**_mats("C", "aux")(M, N, d, t), "cbias": _vec(M, d, t),
                                               "rbias": _vec(N, d, t), **_SCALARS})
                for name, fn in (("no_reductions", m_no_reductions), ("col_max", m_col_max),
                                 ("row_max", m_row_max), ("mixed_dag", m_full))]],
    # dgelu_bgrad: one M x N input, the derivative's math, a column sum
    "dgelu": [(name, fn, _mats("pre")) for name, fn in (("product", d_product), ("product_sum", d_product_sum),
                                                         ("derivative", d_derivative), ("dgelu_bgrad", d_full))],
    # rowreduce_tanh: one M x N input, tanh, a row sum
    "rowreduce": [(name, fn, lambda M, N, d, t: {**_mats("C")(M, N, d, t), **_SCALARS})
                  for name, fn in (("no_tanh", r_no_tanh), ("no_sum", r_no_sum), ("rowreduce_tanh", r_full))],
    # bce_loss: one M x N input (0/1 labels), an M vector, a scalar sum and no tile store
    "bce": [("bce_loss", WORKLOADS["bce_loss"].fn, WORKLOADS["bce_loss"].make_inputs)],
}


# every member by name (power_probe's jobs take them as workloads)
MEMBERS: dict[str, tuple[object, object]] = {name: (fn, make) for members in FAMILIES.values()
                                             for name, fn, make in members}
CONFIG_NAMES = ("regs", "regs6", "mma", "tma", "smem")


def named_epilogue(name: str):
    """(epilogue, make_inputs) of a probe's job (power_probe, ncu_probe): a bench workload, the identity, or a
    member of a family here."""
    from benchmarks.pingpong_check import workload

    return MEMBERS[name] if name in MEMBERS else workload(name)


# configs beyond --configs for one family: the tuner's pick for mixed_dag at both bench shapes
EXTRA_CONFIGS = {"mixed": ["smem"]}


def identity(acc):
    return acc


def configs_for(fn, inputs, M, N, names) -> dict:
    """The forced configs ``names`` as this epilogue can run them (all ping-pong halves of 128x128x64 tiles):

    - ``regs``: from registers in the blocked layout, 5 stages (``regs6``: 6, 213 KB of shared memory);
    - ``mma``: the wgmma layout, its tile outputs stored by TMA, 4 stages;
    - ``tma``: ``mma`` with the one M x N input through the loader (EPI_TMA; epilogues that have one);
    - ``smem``: the accumulator through shared memory, the epilogue looped over its slices from there (EPI_SMEM =
      1: what the tuner picks for mixed_dag).

    The wgmma-layout configs are left out where the epilogue stores tiles TMA cannot take."""
    from evtorch.api import get_epilogue
    from evtorch.codegen.configs import GemmConfig
    from evtorch.codegen.program import build_program

    ep = get_epilogue(fn, (M, N), torch.float32, inputs)
    code = build_program(ep, out_dtype=torch.bfloat16).epilogue
    stored = len(code.tma_outputs)
    halves = (("EPILOGUE_SUBTILE", True),)
    mma = halves + (("EPI_MMA", True),) + ((("TMA_STORE", stored),) if stored else ())
    wgmma_ok = bool(stored) or not code.tile_stores
    choices = {"regs": (5, halves, True), "regs6": (6, halves, True), "mma": (4, mma, wgmma_ok),
               "tma": (4, mma + (("EPI_TMA", True),), wgmma_ok and code.tma_input() is not None),
               "smem": (4, halves + (("EPI_SMEM", 1),), True)}
    return {name: GemmConfig("pingpong", 128, 128, 64, 8, 1, 4, stages, extra)
            for name, (stages, extra, ok) in choices.items() if name in names and ok}


def precompile(calls, log) -> None:
    """Run every call once in a pool of threads (each compiles its kernel, as the tuner's ``prepare`` does), so the
    timing loop only loads binaries."""
    from concurrent.futures import ThreadPoolExecutor

    stream = torch.cuda.current_stream()
    t = time.time()

    def run(call):
        try:
            with torch.cuda.stream(stream):
                call()
        except Exception as exc:  # noqa: BLE001 - the checked call below meets it again and reports it
            log(f"precompile: {type(exc).__name__}: {exc}")

    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        list(pool.map(run, calls))
    torch.cuda.synchronize()
    log(f"precompiled {len(calls)} kernels in {time.time() - t:.0f} s")


@contextlib.contextmanager
def variant_b(ab):
    """Variant B's environment setting ``(NAME, VALUE)`` around the calls inside; evtorch's remembered programs and
    launches are dropped on entry and exit, so each variant prepares (and compiles) its own kernels."""
    import evtorch.runtime.gemm as rg
    from benchmarks.experiment import environ

    rg.clear_caches()
    try:
        with environ(*ab):
            yield
    finally:
        rg.clear_caches()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="8192x4096x1024")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--configs", default="regs,mma,tma")
    ap.add_argument("--members", default="", help="only these members (comma-separated names; default all)")
    ap.add_argument("--ab", default="", help="NAME=VALUE: also time every member with this environment setting "
                    "(variant B, its own kernels: codegen knobs), in the same rounds")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rep-ms", type=float, default=100.0)
    ap.add_argument("--deadline-s", type=float, default=500.0)
    args = ap.parse_args(argv)
    os.environ["EVTORCH_CACHE_DIR"] = tempfile.mkdtemp(prefix="evtorch_ablation_")
    import triton

    import evtorch as evt
    from benchmarks.experiment import poisoned
    from benchmarks.harness import Harness
    from benchmarks.pingpong_check import max_error
    from evtorch.examples import eager_reference, operands

    results = {"env": {"torch": torch.__version__, "triton": triton.__version__,
                       "device": torch.cuda.get_device_name(), "argv": sys.argv[1:]}, "rows": []}
    b = Harness(args, "ablation", results, cuda=True, warmup_ms=25.0, rep_ms=args.rep_ms, t0=T0)
    b.log("ENV", json.dumps(results["env"]))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    names = args.configs.split(",")
    ab = tuple(args.ab.split("=", 1)) if args.ab else None
    for shape in args.shapes.split(","):
        M, N, K = (int(v) for v in shape.split("x"))
        torch.manual_seed(0)
        A, B = operands(M, N, K, "cuda", torch.bfloat16)
        waves = (M // 128) * (N // 128) / sms
        plan = {}
        for family in args.families.split(","):
            members = []
            for member, fn, make in FAMILIES[family]:
                if args.members and member not in args.members.split(","):
                    continue
                inputs = make(M, N, "cuda", torch.bfloat16)
                for cname, cfg in configs_for(fn, inputs, M, N, names + EXTRA_CONFIGS.get(family, [])).items():
                    members.append((member, fn, inputs, cname, cfg))
            plan[family] = members
        base_cfgs = configs_for(identity, {}, M, N, ["regs", "regs6", "mma", "smem"])
        calls = ([lambda cfg=cfg: evt.gemm(A, B, config=cfg) for cfg in base_cfgs.values()]
                 + [lambda fn=fn, cfg=cfg, inputs=inputs: evt.gemm(A, B, fn, config=cfg, **inputs)
                    for members in plan.values() for _, fn, inputs, _, cfg in members])
        precompile(calls, b.log)
        if ab:
            with variant_b(ab):
                precompile(calls[len(base_cfgs):], b.log)
        for family in args.families.split(","):
            if b.time_left() < 60:
                b.log(f"deadline: {family} {shape} skipped")
                continue
            graphs, meta = {"cublas": lambda: torch.matmul(A, B)}, {}
            wanted = set(names + EXTRA_CONFIGS.get(family, []))
            if "tma" in wanted:  # its identity is the wgmma layout's
                wanted.add("mma")
            for cname, cfg in base_cfgs.items():
                if cname in wanted:
                    graphs[f"identity|{cname}"] = b.capture(lambda cfg=cfg: evt.gemm(A, B, config=cfg))
            for member, fn, inputs, cname, cfg in plan[family]:
                def call(fn=fn, cfg=cfg, inputs=inputs):
                    return evt.gemm(A, B, fn, config=cfg, **inputs)
                try:
                    err = max_error(poisoned(call), eager_reference(fn, A, B, **inputs))
                except Exception as exc:  # noqa: BLE001 - one member failing must not end the experiment
                    b.log(f"{shape} {family} {member} {cname}: {type(exc).__name__}: {exc}")
                    continue
                graphs[f"{member}|{cname}"] = b.capture(call)
                meta[f"{member}|{cname}"] = {"err": err, "config_short": cfg.short()}
                if ab:
                    with variant_b(ab):
                        err_b = max_error(poisoned(call), eager_reference(fn, A, B, **inputs))
                        graphs[f"{member}|{cname}|B"] = b.capture(call)
                    meta[f"{member}|{cname}|B"] = {"err": err_b, "config_short": cfg.short(), "variant": "B"}
            graphs = {k: g for k, g in graphs.items() if g is not None}
            timed = b.paired(graphs, rounds=args.rounds)
            cub = timed["cublas"][0]
            for key, (ms, rounds) in timed.items():
                if key == "cublas":
                    continue
                member, cname = key.split("|")[:2]
                base = timed.get(f"identity|{'mma' if cname == 'tma' else cname}", (None,))[0]
                row = {"shape": [M, N, K], "family": family, "member": member, "config": cname, "ms": ms,
                       "variant": "B" if key.endswith("|B") else "A",
                       "rounds": rounds, "cublas_ms": cub, "vs_cublas": ms / cub,
                       "us_per_tile_over_identity": None if base is None else (ms - base) * 1e3 / waves,
                       **meta.get(key, {})}
                results["rows"].append(row)
                extra = "" if base is None else f" | +{row['us_per_tile_over_identity']:6.2f} us/tile"
                b.log(f"{shape} {family:9s} {member:16s} {cname:4s} {row['variant']} {ms:.4f} ms | "
                      f"{ms / cub:.3f} x cuBLAS{extra} | err {meta.get(key, {}).get('err', 0):.1e}")
            b.save()
    return b.finish()


if __name__ == "__main__":
    sys.exit(main())

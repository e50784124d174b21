"""Hardware counters of chosen (workload, config) kernels, for deciding what limits them (run under Nsight Compute).

    ncu --clock-control none --profile-from-start off -k regex:'gemm_|nvjet|sm90' \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \\
        python3 -m benchmarks.ncu_probe --shape 8192,4096,1024 lincomb_relu:g_h identity:g_h cublas

Every job is compiled and run once first (outside the profiled range), then each runs once more between
``cudaProfilerStart`` / ``cudaProfilerStop``, so Nsight Compute sees exactly one launch of every job's kernels
(the poison fills and reduction finalizers are filtered out by ``-k``). A job is ``workload:config`` (a bench
workload, or a member of ``benchmarks.ablation``'s families) with a config name from ``configs()`` (or
``cublas``: ``torch.matmul`` alone), optionally followed by ``@NAME=VALUE``: that job's epilogue is traced and
called with the environment variable set (a knob read at trace time, ``EVTORCH_INTERMEDIATES=float32``,
``EVTORCH_FAST_MATH=never``, ``EVTORCH_DISABLE_PASSES=reassociate``), so variants of one kernel are profiled
side by side in one call, as ``benchmarks.ab_check`` times them:
``bce_loss:mma_h_tma bce_loss:mma_h_tma@EVTORCH_INTERMEDIATES=float32``. evtorch's per-call caches are keyed by
the trace knobs (``evtorch.runtime.knobs.TRACE_KNOBS``) and its programs by their IR's hash, so a device-only
patch's switch that changes the emission alone must join both (the knobs, and ``fastmath.program_hash``, as the
lab notebook's logsigmoid A/Bs did), or the second job reuses the first's kernel. ``python -m benchmarks.ncu_probe --summarize REPORT.txt`` turns a saved report into a markdown table (duration, L2 / DRAM bytes and throughput, SM
throughput and clock, spills), one row per kernel in launch order. Without ncu it prints each job's time
(median, L2 flushed; with ``--graph`` also the tuner's measure: CUDA-graph replays, no flush) so the same command
also works as a quick timing check.
"""
from __future__ import annotations

import argparse
import sys


def configs() -> dict:
    """The config names a job may use: the tuner's persistent picks and the ping-pong variants."""
    from benchmarks.pingpong_check import gl, tma

    return {
        "base": tma(128, 256, 8, 3, EPILOGUE_SUBTILE=True),
        "base_q4_flat": tma(128, 256, 8, 3, EPILOGUE_SUBTILE=4, FLATTEN=True),
        "g_h": gl(5, 2),
        "g_h_p0": gl(5, 2, PREFETCH=0),
        "g_q4_p0": gl(5, 4, PREFETCH=0),
        "g_h_tma": gl(4, 2, EPI_TMA=True),
        "mma_h_tma": gl(4, 2, EPI_MMA=True, EPI_TMA=True),  # the tuner's pick for bce_loss on the H100 and H200
        # the tuner's pick for rowreduce_tanh and dgelu_bgrad at 8192x4096x1024 (H200, 2026-11-27)
        "mma_h_tma_ts1": gl(4, 2, EPI_MMA=True, EPI_TMA=True, TMA_STORE=1),
        # the same two on five ring stages (policy.MMA_TMA_STAGES: the tuner's configs since 2026-11-27 15:00)
        "mma_h_tma5": gl(5, 2, EPI_MMA=True, EPI_TMA=True),
        "mma_h_tma5_ts1": gl(5, 2, EPI_MMA=True, EPI_TMA=True, TMA_STORE=1),
        # the same as a runtime loop over the register-carried slices (EPI_LOOP): one slice's code per consumer
        "mma_el_h_tma": gl(4, 2, EPI_MMA=True, EPI_TMA=True, EPI_LOOP=True),
        "mma_el_h_tma_ts1": gl(4, 2, EPI_MMA=True, EPI_TMA=True, EPI_LOOP=True, TMA_STORE=1),
        "g_q4_tma": gl(4, 4, EPI_TMA=True),
        "es1_h": gl(4, 2, EPI_SMEM=1),
        "es2_q4": gl(4, 4, EPI_SMEM=2),
        "es1_s8": gl(4, 8, EPI_SMEM=1),
    }


# (column, ncu's row name) of the summary table: section rows and --metrics rows alike
SUMMARY = (("duration us", "Duration"), ("L2 bytes", "lts__t_bytes.sum"), ("DRAM bytes", "dram__bytes.sum"),
           ("L2 %", "L2 Cache Throughput"), ("DRAM %", "DRAM Throughput"), ("SM %", "Compute (SM) Throughput"),
           ("SM GHz", "SM Frequency"), ("spill requests", "Local Memory Spilling Requests"))


def summarize(text: str) -> list[dict]:
    """One dict per profiled kernel of an ncu text report (the command in the module docstring): its name and the
    ``SUMMARY`` values as printed (unit and number; missing rows are absent)."""
    import re

    rows = []
    for block in re.split(r"\n  (?=\S+ \(\d+, \d+, \d+\)x\()", text)[1:]:
        row = {"kernel": block.split(" ", 1)[0]}
        for column, name in SUMMARY:
            m = re.search(re.escape(name) + r"\s+(\S*?)\s+([\d,.]+)\s*$", block, re.M)
            if m:
                row[column] = f"{m.group(2)} {m.group(1)}".strip()
        rows.append(row)
    return rows


def _source_kernels(path: str) -> list[tuple[str, list[dict]]]:
    """(kernel name, rows) per kernel of a source-page export (gzipped or not), rows in SASS order."""
    import csv
    import gzip
    import io

    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        text = f.read()
    out = []
    for block in text.split('"Kernel Name",')[1:]:
        name, rest = block.split("\n", 1)
        out.append((name.strip('",'), list(csv.DictReader(io.StringIO(rest)))))
    return out


def _opcode(row: dict) -> str:
    import re

    text = re.sub(r"^@!?U?P\w+\s+", "", row["Source"].strip())
    return text.split()[0] if text else ""


def _samples(row: dict) -> dict:
    """Warp-stall samples of one SASS row by reason (the issued-or-not split columns left out)."""
    return {k[6:]: int(v) for k, v in row.items() if k.startswith("stall_") and "Not Issued" not in k and v and int(v)}


def stall_summary(path: str) -> list[dict]:
    """Per kernel of a source-page export (``benchmarks/ncu_source.sh``: ``ncu --page source --csv --print-source
    sass``, gzipped or not): SASS instruction count, warp-stall samples by reason and by opcode, and shared-memory
    wavefronts against the ideal (bank conflicts). Samples of warps parked at a barrier on a NOP (a Gluon
    kernel's idle warps of the loader's warpgroup, waiting at the partitions' join) are counted apart as
    ``parked``: they take no issue slots."""
    import collections

    out = []
    for name, rows in _source_kernels(path):
        reasons, ops = collections.Counter(), collections.Counter()
        waves = collections.Counter()
        parked = 0
        for r in rows:
            op = _opcode(r)
            counts = _samples(r)
            if op == "NOP" and counts.get("barrier"):
                parked += sum(counts.values())
                continue
            reasons.update(counts)
            ops[op.split(".")[0]] += sum(counts.values())
            if op.startswith(("LDS", "STS", "LDSM", "STSM")):
                waves["actual"] += int(r.get("L1 Wavefronts Shared") or 0)
                waves["ideal"] += int(r.get("L1 Wavefronts Shared Ideal") or 0)
        out.append({"kernel": name, "instructions": len(rows), "samples": sum(reasons.values()),
                    "parked": parked, "reasons": dict(reasons.most_common()), "ops": dict(ops.most_common()),
                    "shared_wavefronts": dict(waves)})
    return out


def range_summary(path: str, specs: list[str]) -> list[dict]:
    """Warp-stall samples summed over SASS row ranges, ``K:LO-HI`` (kernel K of the export, rows LO .. HI - 1 of
    its source page): a partition, or a phase of one (the main loop around the HGMMAs, the epilogue after it), to
    split a warp-specialized kernel's samples (docs/benchmarks-log.md, "Where a ping-pong consumer's time goes")."""
    import collections

    kernels = _source_kernels(path)
    out = []
    for spec in specs:
        k, _, span = spec.partition(":")
        lo, _, hi = span.partition("-")
        rows = kernels[int(k)][1][int(lo):int(hi)]
        reasons = collections.Counter()
        for r in rows:
            if not (_opcode(r) == "NOP" and _samples(r).get("barrier")):
                reasons.update(_samples(r))
        out.append({"range": spec, "instructions": len(rows), "samples": sum(reasons.values()),
                    "reasons": dict(reasons.most_common())})
    return out


def split_job(job: str) -> tuple[tuple[str, str, str], tuple[str, str] | None]:
    """``workload:config[@NAME=VALUE]`` -> ((workload, ':', config), (NAME, VALUE) or None); ``("", "")`` for an
    ``@`` without a ``NAME=`` (refused by ``main``)."""
    base, at, setting = job.partition("@")
    env = None
    if at:
        name, eq, value = setting.partition("=")
        env = (name, value) if name and eq else ("", "")
    return base.partition(":"), env


def with_env(env, call):
    """``call`` run with the environment variable ``env`` = (NAME, VALUE) set around it (the old value restored),
    every time: its first call traces the epilogue under the setting, and later calls must find that trace
    (evtorch's per-call caches are keyed by the trace knobs)."""
    if env is None:
        return call
    from benchmarks.experiment import environ

    def run():
        with environ(*env):
            return call()

    return run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="8192,4096,1024", help="M,N,K")
    ap.add_argument("--graph", action="store_true", help="also time CUDA-graph replays without L2 flush (what the "
                    "tuner measures)")
    ap.add_argument("--summarize", metavar="REPORT", help="print a saved ncu text report as a markdown table "
                    "(no GPU needed) instead of running jobs")
    ap.add_argument("--stalls", metavar="CSV", help="print the warp-stall summary of a source-page export "
                    "(benchmarks/ncu_source.sh's ncu_source.csv.gz; no GPU needed) instead of running jobs")
    ap.add_argument("--ranges", nargs="+", metavar="K:LO-HI", help="with --stalls: samples summed over SASS row "
                    "ranges of kernel K instead")
    ap.add_argument("jobs", nargs="*", help="workload:config, or cublas")
    args = ap.parse_args(argv)
    if args.stalls and args.ranges:
        for r in range_summary(args.stalls, args.ranges):
            top = ", ".join(f"{key} {100 * v / max(1, r['samples']):.0f}%" for key, v in list(r["reasons"].items())[:6])
            print(f"{r['range']}: {r['instructions']} SASS rows, {r['samples']} stall samples; {top}")
        return 0
    if args.stalls:
        for i, k in enumerate(stall_summary(args.stalls)):
            pct = {key: 100 * v / max(1, k["samples"]) for key, v in k["reasons"].items()}
            w = k["shared_wavefronts"]
            print(f"{i} {k['kernel']}: {k['instructions']} SASS instructions, {k['samples']} stall samples "
                  f"(+{k['parked']} parked); shared wavefronts {w.get('actual', 0)} / ideal {w.get('ideal', 0)}")
            print("   by reason: " + ", ".join(f"{key} {v:.1f}%" for key, v in list(pct.items())[:8]))
            print("   by opcode: " + ", ".join(f"{op} {100 * v / max(1, k['samples']):.1f}%"
                                           for op, v in list(k["ops"].items())[:8]))
        return 0
    if args.summarize:
        from pathlib import Path

        cols = ["kernel"] + [c for c, _ in SUMMARY]
        print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
        for r in summarize(Path(args.summarize).read_text()):
            print("| " + " | ".join(r.get(c, "-") for c in cols) + " |")
        return 0
    if not args.jobs:
        ap.error("give at least one job (workload:config or cublas), or --summarize REPORT")
    import torch

    import evtorch as evt
    from benchmarks.ablation import MEMBERS, named_epilogue
    from benchmarks.workloads import WORKLOADS

    cfgs = configs()
    known = ["identity", *WORKLOADS, *MEMBERS]
    for job in args.jobs:
        (name, _, cname), env = split_job(job)
        if job != "cublas" and (name not in known or cname not in cfgs or env == ("", "")):
            ap.error(f"job {job!r}: expected cublas or WORKLOAD:CONFIG[@NAME=VALUE] with WORKLOAD one of {known} "
                     f"(bench workloads and benchmarks.ablation's members) and CONFIG one of {sorted(cfgs)}")
    M, N, K = (int(x) for x in args.shape.split(","))
    torch.manual_seed(0)
    A = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    B = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    calls = []
    for job in args.jobs:
        if job == "cublas":
            calls.append((job, lambda: torch.matmul(A, B)))
            continue
        (name, _, cname), env = split_job(job)
        fn, mk = named_epilogue(name)
        inputs = mk(M, N, "cuda", A.dtype)
        calls.append((job, with_env(env, lambda fn=fn, inputs=inputs, cfg=cfgs[cname]:
                                    evt.gemm(A, B, fn, config=cfg, **inputs))))
    for _, call in calls:  # compile and warm up outside the profiled range
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for _, call in calls:
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    import triton.testing

    for job, call in calls:
        ms = triton.testing.do_bench(call, warmup=5, rep=40, return_mode="median")
        line = f"{job:28s} {ms * 1e3:8.1f} us"
        if args.graph:
            from evtorch.runtime.autotune import time_ms

            line += f"   graph replays {time_ms(call, graph=True) * 1e3:8.1f} us"
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

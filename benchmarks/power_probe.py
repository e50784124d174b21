"""Power and clocks under sustained load: is a fused kernel power-bound where it is slower than cuBLAS?

An H200 lowers its SM clock when the board reaches its power limit. A fused kernel moves more bytes than the bare
GEMM (its epilogue's inputs and outputs) and, in the ping-pong template, more L2 traffic per FLOP; if that energy
pushes the board to its cap, the tensor cores run at a lower clock and no schedule change can hide the epilogue.
This probe runs each job back to back for a few seconds (a CUDA graph of many launches, no host gaps) while
``nvidia-smi`` samples power, SM and memory clocks and the clock-event reasons every 50 ms, and reports per job
the time per launch, the median power, the median SM clock and which reasons were active.

    python -m benchmarks.power_probe --out DIR [--shape 8192x4096x1024] [--jobs cublas,lincomb_relu:g_h,...]
                                     [--seconds 3]

A job is ``cublas`` (torch.matmul), ``WORKLOAD`` (evt.gemm with the tuner off: the heuristic config) or
``WORKLOAD:CONFIG`` with CONFIG a name from ``benchmarks.pingpong_check.configs()`` (``PINGPONG_SET`` picks the
set) or one of ``benchmarks.ablation``'s (``CONFIG_NAMES``); WORKLOAD may also be an ablation member
(``benchmarks.ablation.MEMBERS``: e.g. bias_two_stores, the bias epilogue storing two tiles and doing no math).
``--from-bench bench.json`` takes the jobs from a bench run instead: per shape, every row's workload with the
config the tuner picked there, cuBLAS first, after every fourth row and last. ``--baselines`` first runs the jobs
the energy model needs (``BASELINE_JOBS``: the board idle, one spinning thread block, a 1 GiB device copy;
``benchmarks.energy_floor`` turns them into a floor per row). Writes power.json and power_log.txt under --out.
Each row also has its energy per launch (``energy_mj``: median power x time per launch). CUDA only.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

QUERY = "power.draw,clocks.sm,clocks.mem,clocks_event_reasons.active,temperature.gpu"
# clocks_event_reasons.active bits (nvidia-smi -q documents them as "Clocks Event Reasons")
REASONS = {0x1: "idle", 0x2: "app_clocks", 0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal",
           0x40: "hw_thermal", 0x80: "hw_power_brake", 0x100: "display_clocks"}


# Jobs that are not GEMMs, for the energy model (``benchmarks.energy_floor``): ``idle`` samples the board with
# nothing launched; ``spin`` keeps one thread block spinning (``torch.cuda._sleep``), so the clocks are up and
# almost nothing switches: the board's static power at a high clock; ``copy`` copies a COPY_BYTES / 2 tensor
# (COPY_BYTES read + written per launch, as the bench's copy ceiling counts): the energy of a byte of DRAM
# traffic moved through the SMs, the path an epilogue's loads and stores take. ``copy:MIB`` copies a tensor of MIB
# MiB instead (a second copy size, to see that the energy per byte does not depend on it).
BASELINE_JOBS = ("idle", "spin", "copy")
COPY_BYTES = 1 << 30
SPIN_CYCLES = 1_000_000  # one ``_sleep`` launch: about 0.5 ms at the H100's 1980 MHz


BASELINE_SHAPE = "0x0x0"  # the plan's key for the baselines (they take no problem shape)
LIMITS_KEY = "power_limit_w,max_limit_w,max_sm_mhz"  # the results' entry that board_limits() fills


def is_copy(job: str) -> bool:
    """Whether ``job`` is a device copy (``copy`` or ``copy:MIB``)."""
    return job.split(":")[0] == "copy"


def is_baseline(job: str) -> bool:
    """Whether ``job`` is one of the energy model's jobs (no GEMM, no problem shape)."""
    return job in BASELINE_JOBS or is_copy(job)


def with_baselines(plan: dict, extra=()) -> dict:
    """``plan`` (shape -> [(job, config)]) with the energy model's jobs (then ``extra`` ones) in front."""
    return {BASELINE_SHAPE: [(job, None) for job in (*BASELINE_JOBS, *extra)], **plan}


def board_limits() -> str:
    """nvidia-smi's "power.limit, power.max_limit, clocks.max.sm" line (W, W, MHz) for the results' LIMITS_KEY."""
    return subprocess.run(["nvidia-smi", "--query-gpu=power.limit,power.max_limit,clocks.max.sm",
                           "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout.strip()


def copy_bytes(job: str) -> int:
    """Bytes a launch of a ``copy`` / ``copy:MIB`` job moves (read + written)."""
    _, _, mib = job.partition(":")
    if not mib:
        return COPY_BYTES
    if not mib.isdigit() or int(mib) < 1:
        raise ValueError(f"copy job {job!r}: expected copy:MIB with MIB a positive integer (MiB copied)")
    return 2 * int(mib) << 20


def _reasons(mask: int) -> list[str]:
    return [name for bit, name in REASONS.items() if mask & bit]


def _sampler(period_ms: int = 50):
    """``nvidia-smi`` printing a QUERY line every ``period_ms`` to its stdout pipe until terminated."""
    return subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits", "-lms",
                             str(period_ms)], stdout=subprocess.PIPE, text=True)


def _parse(lines: list[str]) -> list[dict]:
    rows = []
    for line in lines:
        parts = [p.strip() for p in line.split(",")]
        try:
            rows.append({"power_w": float(parts[0]), "sm_mhz": float(parts[1]), "mem_mhz": float(parts[2]),
                         "reasons": int(parts[3], 16), "temp_c": float(parts[4])})
        except (ValueError, IndexError):
            continue
    return rows


def bench_jobs(bench: dict) -> dict[str, list[tuple[str, dict | None]]]:
    """shape "MxNxK" -> [(job, config dict or None)] from a bench JSON: every row's workload with its recorded
    config (rows without one are left out), cuBLAS first, after every fourth row and last."""
    out: dict[str, list] = {}
    for row in bench.get("rows", []):
        if not row.get("config_dict"):
            continue
        jobs = out.setdefault("x".join(map(str, row["shape"])), [("cublas", None)])
        jobs.append((row["workload"], row["config_dict"]))
        if sum(1 for j, _ in jobs if j != "cublas") % 4 == 0:
            jobs.append(("cublas", None))
    for jobs in out.values():
        if jobs[-1][0] != "cublas":
            jobs.append(("cublas", None))
    return out


def _job_fn(job: str, M: int, N: int, K: int, config: dict | None = None):
    import torch

    import evtorch as evt
    from benchmarks.ablation import CONFIG_NAMES, configs_for, named_epilogue
    from benchmarks.pingpong_check import configs
    from evtorch.examples import operands

    if job == "spin":
        return lambda: torch.cuda._sleep(SPIN_CYCLES)
    if is_copy(job):
        src = torch.randn(copy_bytes(job) // 4, device="cuda", dtype=torch.bfloat16)
        dst = torch.empty_like(src)
        return lambda: dst.copy_(src)
    torch.manual_seed(0)
    A, B = operands(M, N, K, "cuda", torch.bfloat16)
    if job == "cublas":
        return lambda: torch.matmul(A, B)
    name, _, cname = job.partition(":")
    fn, mk = named_epilogue(name)
    inputs = mk(M, N, "cuda", torch.bfloat16)
    if config is not None:
        from evtorch.codegen.configs import GemmConfig

        cfg = GemmConfig.from_dict(config)
    elif cname in CONFIG_NAMES:
        cfg = configs_for(fn, inputs, M, N, [cname])[cname]
    else:
        cfg = configs()[cname] if cname else None
    return lambda: evt.gemm(A, B, fn, config=cfg, **inputs)


def _summary(job: str, config: dict | None, shape, ms: float | None, samples: list[dict]) -> dict:
    """One probe row: the job, its time per launch, and the medians of the samples (power, clocks, temperature),
    the clock-event reasons seen, the share of samples under the power cap, and the energy per launch."""
    mask = 0
    for r in samples:
        mask |= r["reasons"]
    res = {"job": job, "config": config, "shape": shape, "ms_per_launch": ms, "samples": len(samples),
           "reasons": _reasons(mask),
           "power_reason_share": (sum(1 for r in samples if r["reasons"] & 0x4) / len(samples)) if samples else None}
    for key in ("power_w", "sm_mhz", "mem_mhz", "temp_c"):
        vals = [r[key] for r in samples]
        res[key] = statistics.median(vals) if vals else None
    res["energy_mj"] = res["power_w"] * ms if ms is not None and res["power_w"] is not None else None  # W x ms
    if is_copy(job):
        res["bytes_per_launch"] = copy_bytes(job)
    return res


def measure_idle(seconds: float) -> dict:
    """The board with nothing launched, sampled for ``seconds``."""
    proc = _sampler()
    time.sleep(0.4 + seconds)
    proc.terminate()
    out, _ = proc.communicate(timeout=10)
    return _summary("idle", None, None, None, _parse(out.splitlines())[8:])


def measure(job: str, M: int, N: int, K: int, seconds: float, config: dict | None = None) -> dict:
    import torch

    if job == "idle":
        return measure_idle(seconds)
    fn = _job_fn(job, M, N, K, config)
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    per = (time.perf_counter() - t) / 20
    n = max(10, min(2000, int(0.25 / per)))  # a graph of ~0.25 s of launches
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        with torch.cuda.graph(g):
            for _ in range(n):
                fn()
    torch.cuda.synchronize()
    g.replay()  # settle
    torch.cuda.synchronize()
    proc = _sampler()
    time.sleep(0.3)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    reps = 0
    t = time.perf_counter()
    start.record()
    while time.perf_counter() - t < seconds:
        g.replay()
        reps += 1
        if reps % 4 == 0:
            torch.cuda.synchronize()
    end.record()
    torch.cuda.synchronize()
    proc.terminate()
    out, _ = proc.communicate(timeout=10)
    samples = _parse(out.splitlines())[8:]  # drop the first 0.4 s (sampler start, the GPU rising to load)
    ms = start.elapsed_time(end) / (reps * n)
    return _summary(job, config, None if is_baseline(job) else [M, N, K], ms, samples)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", default="8192x4096x1024")
    ap.add_argument("--jobs", default="cublas,identity,lincomb_relu,bce_loss,cublas")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--from-bench", help="a bench JSON: its rows' workloads with the configs picked there")
    ap.add_argument("--baselines", action="store_true",
                    help=f"first the energy model's jobs ({', '.join(BASELINE_JOBS)}; benchmarks.energy_floor)")
    ap.add_argument("--extra-baselines", default="", metavar="JOBS",
                    help="with --baselines, more jobs after them (e.g. copy:1024, a second copy size)")
    args = ap.parse_args()
    import os

    os.environ.setdefault("EVTORCH_AUTOTUNE", "0")
    import torch

    if not torch.cuda.is_available():
        print("power_probe needs CUDA", file=sys.stderr)
        return 2
    from benchmarks.harness import Harness

    limit = board_limits()
    results = {"device": torch.cuda.get_device_name(), LIMITS_KEY: limit, "rows": []}
    args.deadline_s = float("inf")  # Harness's deadline: the probe runs every job
    b = Harness(args, "power", results, cuda=True, warmup_ms=0.0, rep_ms=0.0, t0=time.time())
    b.log(f"{results['device']}; power.limit, power.max_limit, clocks.max.sm: {limit}")
    if args.from_bench:
        plan = bench_jobs(json.loads(Path(args.from_bench).read_text()))
    else:
        plan = {shape: [(job, None) for job in args.jobs.split(",")] for shape in args.shape.split(",")}
    if args.baselines:
        plan = with_baselines(plan, [job for job in args.extra_baselines.split(",") if job])
    for shape, jobs in plan.items():
        M, N, K = (int(x) for x in shape.split("x"))
        for job, config in jobs:
            try:
                r = measure(job, M, N, K, args.seconds, config)
            except Exception as exc:  # noqa: BLE001 - one failing job must not lose the others
                b.log(f"{job} {shape}: {type(exc).__name__}: {exc}"[:300])
                continue
            results["rows"].append(r)
            per = f"{r['ms_per_launch'] * 1e3:8.1f} us" if r["ms_per_launch"] is not None else "       - us"
            b.log(f"{job:28s} {shape} {per}  power {r['power_w']:6.1f} W  SM "
                f"{r['sm_mhz']:6.0f} MHz  mem {r['mem_mhz']:5.0f} MHz  {r['temp_c']:4.0f} C  power-cap share "
                f"{r['power_reason_share']:.2f}  reasons {','.join(r['reasons']) or '-'}")
            b.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Does the tuner's first call rank the two Hopper templates the way they run a minute later?

    PYTHONUNBUFFERED=1 python -m benchmarks.tuner_state --out $OUT \\
        [--rows bias_gelu_aux@8192x8192x4096,lincomb_relu@8192x8192x4096] [--checkpoints 0,10,30,60]
        [--preload-s 60]

Why: at 8192x8192x4096 the tuner has taken the persistent kernel for bias_gelu_aux, 0.3-1.1% ahead of the best
ping-pong config in its own timings, and the bench has then measured that pick 4-6% behind the ping-pong picks of
other runs; re-timed a minute after tuning, every settled timing mode ranked the ping-pong config ahead
(docs/benchmarks-log.md, "The bench's rounds"; "Next steps as they stood on 2026-11-27", item 0). What differs
is the state of the GPU: a first call times
its candidates seconds after their compile left the GPU idle; the bench times them after minutes of load.

Per row: one public call tunes with a fresh cache directory (the tuner's record names every candidate and its
timings); the tuner's fastest persistent-kernel candidate and its fastest ping-pong candidate are then timed
against each other and cuBLAS by the bench's own measurement (``Harness.paired``) at each checkpoint, that many
seconds after the tuning ended, the three running in turn between checkpoints so the GPU stays under load; a
background ``nvidia-smi`` samples power, SM clock and temperature throughout (``benchmarks.power_probe``'s query).
Expected if the first call's state is what favours the persistent kernel: its time over the ping-pong config's
starts near the tuner's ratio and rises toward the bench's as the board warms; with ``--preload-s`` the board is
already warm when the tuning starts (only the compile's idle is left), which separates the two. Writes tuner_state.json and
tuner_state_log.txt under --out. CUDA only.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TEMPLATES = ("persistent_tma", "pingpong")


def parse_rows(text: str) -> list[tuple[str, tuple[int, int, int]]]:
    """``"w@MxNxK,..."`` -> [(workload, (M, N, K)), ...]; a malformed entry raises ValueError naming it."""
    rows = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        name, _, shape = item.partition("@")
        dims = shape.split("x")
        if not name or len(dims) != 3 or not all(d.isdigit() and int(d) > 0 for d in dims):
            raise ValueError(f"--rows: expected WORKLOAD@MxNxK entries, got {item!r}")
        rows.append((name, tuple(int(d) for d in dims)))
    return rows


def template_picks(timings: dict[str, float | None]) -> dict[str, str]:
    """The fastest candidate of each template in the tuner's record (``timings_ms``: short config name -> ms, None
    for a failed candidate): template -> short name, for the templates that have one."""
    best: dict[str, str] = {}
    for name, ms in timings.items():
        if ms is None:
            continue
        template = next((t for t in TEMPLATES if name.startswith(t)), None)
        if template is not None and (template not in best or ms < timings[best[template]]):
            best[template] = name
    return best


class Sampler:
    """``nvidia-smi`` sampling power, clocks and temperature every ``period_ms`` in the background, each sample
    stamped with ``time.perf_counter()`` as it arrives; ``window(t0, t1)`` summarises the samples in between."""

    def __init__(self, period_ms: int = 100):
        from benchmarks.power_probe import _sampler

        self.samples: list[tuple[float, str]] = []
        self.proc = _sampler(period_ms)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            self.samples.append((time.perf_counter(), line))

    def window(self, t0: float, t1: float) -> dict:
        return window_stats(self.samples, t0, t1)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=10)


def window_stats(samples: list[tuple[float, str]], t0: float, t1: float) -> dict:
    """Median power (W), SM clock (MHz) and temperature (C) of the stamped nvidia-smi lines within [t0, t1], and
    their count; lines that do not parse (a header, '[N/A]') are skipped."""
    from benchmarks.power_probe import _parse

    rows = _parse([line for t, line in samples if t0 <= t <= t1])
    out = {"samples": len(rows)}
    for key in ("power_w", "sm_mhz", "temp_c"):
        vals = [r[key] for r in rows]
        out[key] = statistics.median(vals) if vals else None
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "tuner_state_out")))
    ap.add_argument("--rows", default="bias_gelu_aux@8192x8192x4096,lincomb_relu@8192x8192x4096",
                    help="WORKLOAD@MxNxK,... (bench workloads)")
    ap.add_argument("--checkpoints", default="0,10,30,60",
                    help="seconds after the tuning at which the two picks are timed against each other")
    ap.add_argument("--preload-s", type=float, default=0.0,
                    help="before tuning each row, run cuBLAS back to back for this many seconds (a board already "
                    "warm, as in the bench, where rows follow each other; 0: tune from whatever state it is in)")
    ap.add_argument("--deadline-s", type=float, default=540)
    args = ap.parse_args(argv)
    rows = parse_rows(args.rows)
    checkpoints = sorted(float(c) for c in args.checkpoints.split(",") if c.strip())
    from benchmarks.workloads import WORKLOADS

    unknown = [name for name, _ in rows if name not in WORKLOADS]
    if unknown or not checkpoints:
        ap.error(f"unknown workloads {unknown} (known: {', '.join(WORKLOADS)})" if unknown
                 else "--checkpoints: expected seconds, e.g. 0,10,30,60")
    import torch

    import evtorch as evt
    from benchmarks.harness import Harness
    from benchmarks.tuner_timing import tune_fresh
    from evtorch.examples import operands
    from evtorch.runtime import autotune

    results: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                     "checkpoints_s": checkpoints, "rows": []}
    h = Harness(types.SimpleNamespace(out=str(args.out), deadline_s=args.deadline_s), "tuner_state", results,
                cuda=True, warmup_ms=25, rep_ms=250, t0=time.time())
    h.log(f"tuner_state on {results['device']} (torch {torch.__version__})")
    scratch = tempfile.mkdtemp(prefix="tuner_state_")
    sampler = Sampler()
    try:
        for name, (M, N, K) in rows:
            if h.time_left() < checkpoints[-1] + args.preload_s + 30:
                h.log(f"deadline: {name} at {M}x{N}x{K} and after not run")
                break
            torch.manual_seed(0)
            A, B = operands(M, N, K, "cuda", torch.bfloat16)
            inputs = WORKLOADS[name][1](M, N, "cuda", torch.bfloat16)
            fn = WORKLOADS[name][0]
            if args.preload_s > 0:
                autotune.settle(lambda: torch.matmul(A, B), args.preload_s * 1e3)
            t_tune = time.perf_counter()
            picked, record = tune_fresh(evt, A, B, fn, inputs, os.path.join(scratch, f"{M}x{N}x{K}_{name}"))
            tuned = time.perf_counter()
            picks = template_picks(record["timings_ms"])
            row = {"workload": name, "shape": [M, N, K], "tuned_pick": picked.short(), "picks": picks,
                   "tuner_ms": {t: record["timings_ms"][c] for t, c in picks.items()},
                   "tuning_power": sampler.window(t_tune, tuned), "checkpoints": []}
            results["rows"].append(row)
            h.log(f"{name} {M}x{N}x{K}: tuner picked {picked.short()}; "
                  + ", ".join(f"{t} {c} {row['tuner_ms'][t]:.4f} ms" for t, c in picks.items()))
            if len(picks) < 2:
                h.log("  one template only: nothing to compare")
                continue
            calls = {"cublas": lambda: torch.matmul(A, B)}
            for template, short in picks.items():
                cfg = record["candidates"][short]
                calls[template] = lambda cfg=cfg: evt.gemm(A, B, fn, config=cfg, **inputs)
            for at in checkpoints:
                while time.perf_counter() - tuned < at:  # keep the GPU under the three's load until the checkpoint
                    autotune.settle(lambda: [c() for c in calls.values()], 500)
                t0 = time.perf_counter()
                timed = h.paired(calls)
                t1 = time.perf_counter()
                cp = {"at_s": round(t0 - tuned, 1), **{k: v[0] for k, v in timed.items()},
                      "ratio": timed["persistent_tma"][0] / timed["pingpong"][0], **sampler.window(t0, t1)}
                row["checkpoints"].append(cp)
                h.log(f"  +{cp['at_s']:5.1f} s: persistent / ping-pong {cp['ratio']:.3f} (cuBLAS "
                      f"{cp['cublas']:.4f}, persistent {cp['persistent_tma']:.4f}, ping-pong {cp['pingpong']:.4f} ms)"
                      f"; {cp['power_w']} W, {cp['sm_mhz']} MHz, {cp['temp_c']} C")
            h.save()
    finally:
        sampler.stop()
    return h.finish()


if __name__ == "__main__":
    sys.exit(main())

"""Does the tuner rank its candidates the way the bench then measures them? Every candidate the tuner timed for a
bench workload, re-timed in several ways in interleaved rounds, against the bench's own measurement::

    PYTHONUNBUFFERED=1 python -m benchmarks.tuner_timing --out $OUT [--shapes 8192x4096x1024]
        [--workloads identity,bias_gelu_aux,...] [--rounds 3] [--sustained bias_gelu_aux@8192x8192x4096]

Why: at 8192x4096x1024 the tuner timed calls as graph replays back to back, without the L2 flush the bench does
between runs. In the 2026-11-25 17:47 H100 run its time for bias_gelu_aux's pick was 6% above the bench's (0.134
against 0.126 ms), and it ranked the sixth ring stage, 6% faster than the 5-stage ring in a forced A/B with L2
flushed, 5% behind that pick (docs/benchmarks-log.md, "The tuner's timing conditions"). At 8192x8192x4096 the persistent kernel has won
bias_gelu_aux's tuning by 1-2% and then measured 2-4% slower in the bench's sustained rounds (docs/benchmarks-log.md,
"Next steps as they stood on 2026-11-27", item 0).

Per (shape, workload): one public call tunes with a fresh cache directory (the tuner's record,
``autotune.stored_records``, names every candidate and its timings); then R rounds, in each of which every mode of
``--modes`` (``MODES``; those of ``--sustained`` rows add ``sustained``) times every candidate in turn, cuBLAS
alongside. A mode's pick is its lowest median; ``summarize`` says what the reference mode (``paired``, the bench's
own measurement, where it is timed; else ``bench``) gives that pick against the best it found, and how the mode's
ranking correlates with the reference's. Writes tuner_timing.json and
tuner_timing_log.txt under --out.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# mode -> what it times (the ``bench`` mode is the reference every other is judged by)
MODES = {
    "back_to_back": "the tuner's timing until 2026-11-25 for calls under GRAPH_BELOW_MS: 200 ms settle, then "
                    "do_bench_cudagraph (the call replayed back to back, no L2 flush)",
    "tuner": "autotune.time_ms(call, graph='auto'), the tuner's first pass (its close candidates then meet in "
             "the final, autotune.interleaved_ms, since 2026-11-27: the paired mode's measurement)",
    "bench": "300 ms settle, then do_bench of the public call (L2 flushed), 50 ms (the bench's measurement until "
             "2026-11-26; it has no cuBLAS between the timings)",
    "no_settle": "do_bench of the public call (L2 flushed), 50 ms, with no settling of its own: right after the "
                 "previous candidate's timing",
    "paired": "the bench's measurement since 2026-11-26: Harness.paired with cuBLAS (both run for the tuner's "
              "warm-up, one round discarded since 2026-11-27, then 5 rounds in rotated order), evtorch's median",
    "after_self": "the tuner's warm-up (autotune.WARMUP_MS) of running the candidate, then do_bench of the public "
                  "call (L2 flushed), 50 ms",
    "after_cublas": "the tuner's warm-up of running cuBLAS (torch.matmul(A, B)), then do_bench of the public call "
                    "(L2 flushed), 50 ms, with no settling of its own: the candidate following another GEMM",
}
SUSTAINED = "1000 ms settle, then do_bench of the public call (L2 flushed), 100 ms"


def back_to_back(fn) -> float:
    from triton.testing import do_bench_cudagraph

    from evtorch.runtime import autotune

    autotune.settle(fn, autotune.SETTLE_MS)
    return float(do_bench_cudagraph(fn, rep=10, return_mode="median"))


def measured(fn, settle_ms: float, rep_ms: float) -> float:
    """The call itself after ``settle_ms`` of running it, do_bench median with L2 flushed (``autotune.time_ms``
    without a graph: what the bench's ``Harness.paired`` does per round)."""
    from evtorch.runtime import autotune

    return autotune.time_ms(fn, warmup_ms=25, rep_ms=rep_ms, graph=False, settle_ms=settle_ms)


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    for r, i in enumerate(order):
        ranks[i] = float(r)
    return ranks


def spearman(a: list[float], b: list[float]) -> float:
    """Rank correlation of two equally long lists (no tie correction: timings rarely tie)."""
    n = len(a)
    if n < 2:
        return float("nan")
    ra, rb = _ranks(a), _ranks(b)
    d2 = sum((x - y) ** 2 for x, y in zip(ra, rb))
    return 1.0 - 6.0 * d2 / (n * (n * n - 1))


def summarize(samples: dict[str, dict[str, list[float]]], reference: str = "bench") -> dict:
    """``samples[mode][candidate]`` = that mode's timings of the candidate over the rounds. Per mode: its pick
    (lowest median), the reference mode's median for that pick over the reference's best (``pick_cost``: 1.0 = the
    mode picked what the reference ranks first), and the rank correlation of its medians with the reference's."""
    med = {mode: {c: statistics.median(ts) for c, ts in per.items()} for mode, per in samples.items()}
    ref = med[reference]
    best_ref = min(ref.values())
    names = sorted(ref)
    out = {}
    for mode, m in med.items():
        pick = min(m, key=m.get)
        out[mode] = {"pick": pick, "pick_ms": m[pick], "pick_cost": ref[pick] / best_ref,
                     "spearman": spearman([m[c] for c in names], [ref[c] for c in names]), "medians": m}
    return out


def tune_fresh(evt, A, B, epilogue, inputs, cache: str):
    """One public call with tuning into the fresh cache directory ``cache``: (picked config, the tuner's record)."""
    from benchmarks.experiment import environ
    from evtorch.runtime import autotune, gemm

    picked = []
    autotune.clear_memory_cache()
    gemm.FIRST_CALL_HOOKS.append(picked.append)
    try:
        with environ("EVTORCH_CACHE_DIR", cache):
            evt.gemm(A, B, epilogue, **inputs)
            records = autotune.stored_records()
    finally:
        gemm.FIRST_CALL_HOOKS.remove(picked.append)
    if len(records) != 1:
        raise RuntimeError(f"expected one tuning record under {cache}, found {len(records)}")
    return picked[0], records[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "tuner_timing_out")))
    ap.add_argument("--shapes", default="8192x4096x1024", help="shapes every workload runs at ('' for none)")
    ap.add_argument("--workloads", default="identity,lincomb_relu,bias_gelu_aux,colbcast_leaky,rowreduce_tanh,"
                                           "bce_loss,dgelu_bgrad,mixed_dag")
    ap.add_argument("--sustained", default="bias_gelu_aux@8192x8192x4096",
                    help="workload@shape rows (their shapes added to --shapes) that also time the sustained mode")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default="back_to_back,tuner,bench",
                    help="which of " + ", ".join(MODES) + " to time (the reference the others are judged by: "
                    "paired if given, else bench, else tuner)")
    ap.add_argument("--top", type=int, default=0, help="re-time only the N candidates the tuner timed fastest "
                    "(0: all)")
    ap.add_argument("--deadline-s", type=float, default=540)
    args = ap.parse_args(argv)
    import torch

    import evtorch as evt
    from benchmarks.harness import Harness
    from benchmarks.workloads import WORKLOADS
    from evtorch.examples import operands
    from evtorch.runtime import autotune

    sustained = {tuple(s.split("@")) for s in args.sustained.split(",") if s}
    plain = [s for s in args.shapes.split(",") if s]
    shapes = list(dict.fromkeys(plain + [shape for _, shape in sorted(sustained)]))
    results: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                     "modes": {**MODES, "sustained": SUSTAINED}, "rows": []}
    h = Harness(types.SimpleNamespace(out=str(args.out), deadline_s=args.deadline_s), "tuner_timing", results,
                cuda=True, warmup_ms=25, rep_ms=250, t0=time.time())
    h.log(f"tuner_timing on {results['device']} (torch {torch.__version__})")
    scratch = tempfile.mkdtemp(prefix="tuner_timing_")
    for shape in shapes:
        M, N, K = (int(v) for v in shape.split("x"))
        torch.manual_seed(0)
        A, B = operands(M, N, K, "cuda", torch.bfloat16)
        names = [w for w in args.workloads.split(",") if shape in plain]
        names += [w for w, s in sorted(sustained) if s == shape and w not in names]
        for name in names:
            if h.time_left() < 60:
                h.log(f"deadline: {name} at {shape} and after not run")
                return h.finish()
            fn, make = (None, lambda M, N, d, t: {}) if name == "identity" else WORKLOADS[name][:2]
            inputs = make(M, N, "cuda", torch.bfloat16)
            picked, record = tune_fresh(evt, A, B, fn, inputs, os.path.join(scratch, f"{shape}_{name}"))
            cands = record["candidates"]
            timed = sorted((c for c in cands if record["timings_ms"].get(c) is not None),
                           key=lambda c: record["timings_ms"][c])
            calls = {c: (lambda cfg=cands[c]: evt.gemm(A, B, fn, config=cfg, **inputs))
                     for c in timed[:args.top or None]}
            timers = {"back_to_back": back_to_back, "tuner": lambda f: autotune.time_ms(f, graph="auto"),
                      "bench": lambda f: measured(f, 300, 50), "no_settle": lambda f: measured(f, 0, 50),
                      "paired": lambda f: h.paired({"cublas": lambda: torch.matmul(A, B), "evt": f})["evt"][0],
                      "after_self": lambda f: measured(f, autotune.WARMUP_MS, 50),
                      "after_cublas": lambda f: (autotune.settle(lambda: torch.matmul(A, B), autotune.WARMUP_MS),
                                                 measured(f, 0, 50))[1]}
            modes = {m: timers[m] for m in args.modes.split(",")}
            if (name, shape) in sustained:
                modes["sustained"] = lambda f: measured(f, 1000, 100)
            samples = {mode: {c: [] for c in calls} for mode in modes}
            cublas = []
            for _ in range(args.rounds):
                cublas.append(measured(lambda: torch.matmul(A, B), 300, 50))
                for mode, timer in modes.items():  # a mode times every candidate in turn (no_settle: one after another)
                    for c, call in calls.items():
                        samples[mode][c].append(timer(call))
            reference = next(m for m in ("paired", "bench", "tuner") if m in modes)
            summary = summarize(samples, reference=reference)
            cub = statistics.median(cublas)
            row = {"shape": [M, N, K], "workload": name, "tuned_pick": picked.short(), "tuner_ms": record["timings_ms"],
                   "cublas_ms": cub, "samples": samples, "summary": summary}
            results["rows"].append(row)
            h.log(f"{shape} {name}: tuner picked {picked.short()} (cuBLAS {cub:.4f} ms)")
            for mode, s in summary.items():
                ref_ms = summary[reference]["medians"][s["pick"]]
                h.log(f"  {mode:13s} picks {s['pick']:70s} {reference} x{ref_ms / cub:.3f} cuBLAS, "
                      f"{s['pick_cost']:.3f} of its best; rank corr {s['spearman']:+.2f}")
            h.save()
    return h.finish()


if __name__ == "__main__":
    sys.exit(main())

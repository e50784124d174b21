"""Per-round profile of bench runs: does one round of ``Harness.paired`` run slow for one function every time?

    python -m benchmarks.rounds benchmarks/results/bench_h100_run*.json [--json FILE]

Each bench row keeps the five rounds' times of every function it timed in interleaved rounds (``*_rounds``:
cuBLAS and evtorch in phase 1; evtorch and torch.compile again beside cuBLAS in phase 2). Dividing each round by its
row's median and averaging by round over many rows shows a disturbance tied to a place in the sequence, which a
median per row hides: with 300 ms of settling, the eighth timing of every row, evtorch's, ran 2.9-8.8% slow over
the H100 runs of 2026-11-25/26 (docs/benchmarks-log.md, "The bench's rounds"). Also counted: in how many rows each
round was its function's slowest.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

#: the bench JSON's per-round series: key -> what it times
SERIES = {
    "cublas_ms_rounds": "cuBLAS, beside evtorch",
    "evt_ms_rounds": "evtorch, beside cuBLAS (and torch.compile, from 2026-11-27)",
    "evt_ms_at_compile_rounds": "evtorch, beside cuBLAS and torch.compile (until 2026-11-26)",
    "compile_ms_rounds": "torch.compile",
}


def profile(rows: list[dict], key: str) -> dict | None:
    """Over the rows that have ``key`` (a list of per-round times, all rows the same length): per round, the mean
    of its time over its row's median (``mean``) and the number of rows where it was the slowest (``slowest``);
    None if no row has it."""
    series = [r[key] for r in rows if isinstance(r.get(key), list) and r[key]]
    if not series:
        return None
    n = len(series[0])
    series = [s for s in series if len(s) == n]
    ratios = [[x / statistics.median(s) for x in s] for s in series]
    return {"rows": len(series),
            "mean": [statistics.fmean(r[i] for r in ratios) for i in range(n)],
            "slowest": [sum(1 for s in series if s.index(max(s)) == i) for i in range(n)]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+", type=Path, help="bench JSONs (evtorch bench's bench.json)")
    ap.add_argument("--json", type=Path, help="also write the profiles here")
    args = ap.parse_args(argv)
    rows = []
    for path in args.files:
        rows += json.loads(path.read_text()).get("rows", [])
    out = {}
    for key, what in SERIES.items():
        p = profile(rows, key)
        if p is None:
            continue
        out[key] = p
        print(f"{what} ({p['rows']} rows): mean per round " + " ".join(f"{m:.3f}" for m in p["mean"])
              + "; slowest in " + " ".join(str(c) for c in p["slowest"]))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

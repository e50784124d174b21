"""Host time of two versions of evtorch, A and B, in alternating processes: ``host_overhead`` run in round after
round, A then B (then B then A in the next round, so neither always goes first), each in a fresh process, and
per case the paired differences of the rounds.

    python -m benchmarks.host_ab --a ../old --b . --rounds 6 --only linear_fwd_bwd linear_fwd_bwd_compiled
    python -m benchmarks.host_ab --a ../old --b . --rounds 6 -- --device cuda --real   # on a GPU machine

Why: a host-time change of 10-40 us does not show between two single processes on the device machines. On the
H200 machine of 2026-11-28 (23:24 UTC) eager PyTorch's own training step measured 152-248 us in four processes
one after another, and the compiled evtorch step 1040 / 999 us on the old code against 1039 / 863 on the new
(``benchmarks/results/host_overhead_h200_20261128_2324_operator_ab.json``): the spread between processes was
larger than the change. Each process's number is already the lowest of five medians; what moves is the process
(which cores, which clocks, what else runs). Pairing A and B within a round and alternating which goes first
cancels slow drift; the median and spread of the paired differences say whether B's change is larger than what
separates two processes of the same code (run A against A to see that).

``--a`` and ``--b`` are checkouts (folders holding the ``evtorch`` and ``benchmarks`` packages), each imported
ahead of any installed evtorch (``PYTHONPATH``); arguments after ``--`` go to ``host_overhead`` as they are.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def run_once(tree: Path, extra: list[str], out: Path) -> dict:
    """One ``host_overhead`` process of checkout ``tree``: case -> us per call."""
    env = {**os.environ, "PYTHONPATH": str(tree) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "benchmarks.host_overhead", "--json", str(out), *extra]
    done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"host_ab: {' '.join(cmd)} in {tree} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(out.read_text())["us_per_call"]


def summarize(rounds: list[dict]) -> dict:
    """Per case, from rounds of {"a": {case: us}, "b": {case: us}}: A's and B's medians and ranges, and the
    median and range of the paired differences B - A (negative: B is faster)."""
    cases = [c for c in rounds[0]["a"] if all(c in r["a"] and c in r["b"] for r in rounds)]
    out = {}
    for c in cases:
        a = [r["a"][c] for r in rounds]
        b = [r["b"][c] for r in rounds]
        d = [y - x for x, y in zip(a, b)]
        out[c] = {"a_median": statistics.median(a), "a_range": [min(a), max(a)],
                  "b_median": statistics.median(b), "b_range": [min(b), max(b)],
                  "diff_median": statistics.median(d), "diff_range": [min(d), max(d)],
                  "b_faster_in": sum(x < 0 for x in d), "rounds": len(d)}
    return out


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--a", required=True, type=Path, help="checkout A (the baseline)")
    ap.add_argument("--b", required=True, type=Path, help="checkout B (the change)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--only", nargs="*", default=[], help="host_overhead case names")
    ap.add_argument("--calls", type=int, default=None, help="host_overhead --calls")
    ap.add_argument("--json", type=Path, help="write every round and the summary here")
    args = ap.parse_args(own)
    for tree in (args.a, args.b):
        if not (tree / "evtorch").is_dir() or not (tree / "benchmarks" / "host_overhead.py").is_file():
            ap.error(f"{tree} holds no evtorch/ and benchmarks/host_overhead.py")
    if args.rounds < 1:
        ap.error(f"--rounds must be at least 1, got {args.rounds}")
    extra = (["--only", *args.only] if args.only else []) + (["--calls", str(args.calls)] if args.calls else []) \
        + extra
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            order = ("a", "b") if i % 2 == 0 else ("b", "a")
            r = {}
            for side in order:
                r[side] = run_once(getattr(args, side).resolve(), extra, Path(tmp) / f"{i}_{side}.json")
            rounds.append(r)
            print(f"round {i + 1}/{args.rounds} ({order[0]} first): " + ", ".join(
                f"{c} {r['a'][c]:.1f} -> {r['b'][c]:.1f}" for c in r["a"] if c in r["b"]), flush=True)
    summary = summarize(rounds)
    print(f"\n{'case':<26} {'A median':>9} {'B median':>9} {'B - A median':>13} {'B - A range':>17} {'B faster':>9}")
    for c, s in summary.items():
        lo, hi = s["diff_range"]
        print(f"{c:<26} {s['a_median']:9.1f} {s['b_median']:9.1f} {s['diff_median']:13.1f} "
              f"{f'{lo:.1f} .. {hi:.1f}':>17} {s['b_faster_in']:>4}/{s['rounds']}")
    if args.json:
        args.json.write_text(json.dumps({"a": str(args.a), "b": str(args.b), "extra": extra, "rounds": rounds,
                                         "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

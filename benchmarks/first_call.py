"""How long a first call for a new shape takes (trace, codegen, compile of every tuning candidate, timing), and
how much of it is the candidates' compile (``autotune._prepare_all``) and the whole tuning (``pick_config``).

Each (workload, shape) runs in a fresh Python process with fresh evtorch and Triton caches, so every candidate
is compiled from scratch, as on a new machine::

    python -m benchmarks.first_call --out $OUT --workloads lincomb_relu,dgelu_bgrad --repeat 2

Writes ``first_call.json`` under ``--out``: per run the first call's seconds, its compile and tuning seconds, the
second call's (cached launch) milliseconds, and the config the tuner picked.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, os, sys, time
import torch
import evtorch as evt
from evtorch.runtime import autotune, gemm
from benchmarks.workloads import WORKLOADS
from evtorch.examples import operands
name, M, N, K, candidates = sys.argv[1], *map(int, sys.argv[2:6])
gemm.MAX_TUNE_CANDIDATES = candidates
picked = []
gemm.FIRST_CALL_HOOKS.append(lambda cfg: picked.append(cfg.short()))
phases = {"prepare_s": 0.0, "tune_s": 0.0}
def timed(name, fn):
    def wrapper(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            phases[name] += time.perf_counter() - t
    return wrapper
autotune._prepare_all = timed("prepare_s", autotune._prepare_all)
gemm.pick_config = timed("tune_s", gemm.pick_config)
fn, make_inputs = WORKLOADS[name][:2]
torch.manual_seed(0)
A, B = operands(M, N, K, "cuda", torch.bfloat16)
inputs = make_inputs(M, N, "cuda", torch.bfloat16)
torch.cuda.synchronize()
profile = None
if os.environ.get("FIRST_CALL_PROFILE") == "1":
    import cProfile
    profile = cProfile.Profile()
    profile.enable()
t = time.perf_counter()
evt.gemm(A, B, fn, **inputs)
torch.cuda.synchronize()
first = time.perf_counter() - t
if profile is not None:
    import io, pstats
    profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(45)
    print(text.getvalue(), file=sys.stderr)
t = time.perf_counter()
evt.gemm(A, B, fn, **inputs)
torch.cuda.synchronize()
second = time.perf_counter() - t
print("RESULT " + json.dumps({"first_call_s": round(first, 2), "second_call_ms": round(second * 1e3, 3),
                              "config": picked[0] if picked else None,
                              **{k: round(v, 2) for k, v in phases.items()}}))
"""


def run_one(name: str, shape: tuple[int, int, int], candidates: int, profile: bool = False) -> dict:
    with tempfile.TemporaryDirectory(prefix="evt_first_call_") as tmp:
        env = dict(os.environ, EVTORCH_CACHE_DIR=f"{tmp}/evt", TRITON_CACHE_DIR=f"{tmp}/triton",
                   EVTORCH_AUTOTUNE="1", TRITON_INTERPRET="0",
                   FIRST_CALL_PROFILE="1" if profile else "0",
                   PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        t = time.time()
        proc = subprocess.run([sys.executable, "-c", CHILD, name, *map(str, shape), str(candidates)], env=env,
                              cwd=ROOT, capture_output=True, text=True, timeout=900)
        rec = {"workload": name, "shape": list(shape), "candidates": candidates,
               "process_s": round(time.time() - t, 1)}
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            rec["error"] = (proc.stderr or proc.stdout)[-3000:]
        else:
            rec.update(json.loads(lines[-1][len("RESULT "):]))
        if profile:
            rec["profile"] = proc.stderr[proc.stderr.find("Ordered by"):][:12000]
        return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--workloads", default="lincomb_relu,dgelu_bgrad")
    ap.add_argument("--shapes", default="8192x4096x1024")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each (workload, shape)")
    ap.add_argument("--candidates", type=int, default=5)
    ap.add_argument("--profile", action="store_true", help="cProfile each first call (top functions in the JSON)")
    args = ap.parse_args(argv)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    records = []
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.workloads.split(","):
        for shape in shapes:
            for _ in range(args.repeat):
                rec = run_one(name, shape, args.candidates, args.profile)
                records.append(rec)
                print(json.dumps({k: v for k, v in rec.items() if k != "profile"}), flush=True)
                (args.out / "first_call.json").write_text(json.dumps(records, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

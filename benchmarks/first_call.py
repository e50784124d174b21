"""How long a first call for a new shape takes (trace, codegen, compile of every tuning candidate, timing), and
how much of it is the candidates' compile (``autotune._prepare_all``) and the whole tuning (``pick_config``).

Each (workload, shape) runs in a fresh Python process with fresh evtorch and Triton caches, so every candidate
is compiled from scratch, as on a new machine::

    python -m benchmarks.first_call --out $OUT --workloads lincomb_relu,dgelu_bgrad --repeat 2

Writes ``first_call.json`` under ``--out``: per run the first call's seconds, its compile and tuning seconds, the
second call's (cached launch) milliseconds, and the config the tuner picked; per candidate (``per_config``) its
compile seconds in the thread pool, the exception if that compile failed, and each timing's wall seconds and result.
``--retime`` then times every candidate again, in the tuner's order and in reverse (``retimed``): whether a
candidate's first timing inside the tuner differs from later ones, and whether the order matters.
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
# per candidate: its prepare (compile) seconds and failure, each timing's wall seconds and milliseconds; with
# FIRST_CALL_RETIME=1 every candidate is timed again after the pick, forward then in reverse order
per_cfg, retimed = {}, {"forward": {}, "reverse": {}}
def _entry(cfg):
    return per_cfg.setdefault(cfg.short(), {"timings": []})
def _pick(cands, bench, **kw):
    prep = kw.get("prepare")
    if prep is not None:
        def prepare(cfg):
            t = time.perf_counter()
            try:
                return prep(cfg)
            except Exception as exc:
                _entry(cfg)["prepare_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                raise
            finally:
                _entry(cfg)["prepare_s"] = round(time.perf_counter() - t, 2)
        kw["prepare"] = prepare
    def timed_bench(cfg):
        t = time.perf_counter()
        ms = bench(cfg)
        _entry(cfg)["timings"].append([round(time.perf_counter() - t, 3), round(ms, 5)])
        return ms
    best = _pick_config(cands, timed_bench, **kw)
    if os.environ.get("FIRST_CALL_RETIME") == "1":
        cands = list(cands)[:kw.get("max_candidates", len(cands))]
        for order, seq in (("forward", cands), ("reverse", cands[::-1])):
            for cfg in seq:
                try:
                    retimed[order][cfg.short()] = round(bench(cfg), 5)
                except Exception as exc:
                    retimed[order][cfg.short()] = f"{type(exc).__name__}"
    return best
_pick_config = gemm.pick_config
gemm.pick_config = timed("tune_s", _pick)
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
                              **{k: round(v, 2) for k, v in phases.items()},
                              "per_config": per_cfg, "retimed": retimed}))
"""


def run_one(name: str, shape: tuple[int, int, int], candidates: int, profile: bool = False,
            retime: bool = False) -> dict:
    with tempfile.TemporaryDirectory(prefix="evt_first_call_") as tmp:
        env = dict(os.environ, EVTORCH_CACHE_DIR=f"{tmp}/evt", TRITON_CACHE_DIR=f"{tmp}/triton",
                   EVTORCH_AUTOTUNE="1", TRITON_INTERPRET="0",
                   FIRST_CALL_PROFILE="1" if profile else "0", FIRST_CALL_RETIME="1" if retime else "0",
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
    ap.add_argument("--retime", action="store_true",
                    help="after the pick, time every candidate again, forward then in reverse order")
    args = ap.parse_args(argv)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    records = []
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.workloads.split(","):
        for shape in shapes:
            for _ in range(args.repeat):
                rec = run_one(name, shape, args.candidates, args.profile, args.retime)
                records.append(rec)
                brief = {k: v for k, v in rec.items() if k not in ("profile", "per_config", "retimed")}
                print(json.dumps(brief), flush=True)
                (args.out / "first_call.json").write_text(json.dumps(records, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Run the GPU tests (`pytest -m gpu`) in parallel shards, so that the whole suite fits one device call.

    python -m benchmarks.gpu_tests --out $OUT/gt                      # every GPU test, 8 shards
    python -m benchmarks.gpu_tests --out $OUT/gt --shards 8 tests/test_pingpong_gpu.py
    python -m benchmarks.gpu_tests --out $OUT/gt --balance benchmarks/results/gpu_tests_h200.json

Why: one pytest process spends most of a GPU test's time compiling Triton kernels, so the suite run file by file
took more than a device call's ten minutes on an H200 (2026-11-28: the ping-pong file alone ran out a 480 s limit
after 51 of its 83 tests, about 9 s a test); the device machine has 16 cores for more processes. pytest-xdist
would do the sharding but is not on the device machine, which cannot install packages, so this runner uses pytest
alone:

1. collect the selected tests' node ids (``pytest --collect-only -q -m gpu``);
2. split them into contiguous runs of collection order of about equal weight (neighbouring tests compile
   similar kernels and share fixtures): equal counts, or, with ``--balance PREVIOUS.json``, equal sums of the
   durations a previous run recorded (tests it did not see count as that run's mean);
3. run each shard as its own ``pytest`` process with ``TRITON_INTERPRET=0`` and its share of the CPUs for the
   tuner's compile threads (``EVTORCH_COMPILE_WORKERS``), under a time limit; a small plugin
   (:mod:`benchmarks._test_reports`) appends every test's outcome to a JSON-lines file as it finishes, so a shard
   killed at its limit (or crashed) still reports what it ran, and the tests it did not reach are listed as not
   run;
4. merge: counts, failures with the shard log that holds their traceback, the tests not run, and every test's
   duration (``--balance`` input for the next run) into ``OUT/summary.json``; exit status 0 only when every
   selected test ran and none failed.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = "benchmarks._test_reports"
REPORTS_ENV = "EVTORCH_TEST_REPORTS"


def collect(paths, marker, env, cwd=ROOT):
    """Node ids of the tests ``pytest -m marker paths`` would run, in collection order."""
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", marker, *paths]
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    ids: list = []
    for line in out.stdout.splitlines():  # the ids, then a blank line, the count and any warnings summary
        if not line.strip():
            break
        if "::" in line and not line.startswith(" "):
            ids.append(line.strip())
    ids = list(dict.fromkeys(ids))
    if out.returncode not in (0, 5) or (out.returncode == 0 and not ids):  # 5: nothing collected
        raise SystemExit(f"gpu_tests: collection failed (pytest exit {out.returncode}):\n{out.stdout[-3000:]}"
                         f"{out.stderr[-3000:]}")
    return ids


def shard(ids, n, durations=None):
    """Split ``ids`` (in collection order) into ``n`` contiguous runs of about equal weight: each test weighs its
    duration in ``durations`` (a ``{node id: seconds}`` map from a previous run; tests it lacks weigh its mean), or
    1 without one.

    Contiguous, not dealt round robin: neighbouring tests (one file's, one parametrisation's) compile the same or
    similar kernels and share module fixtures, so a shard of neighbours compiles each once. Dealt round robin, 14
    shards on an H200 (2026-11-28) each compiled what every other did, at once, and finished 7 of 133 tests in
    170 s (one process per file, 11 of them, had run 152 tests in 480 s)."""
    if n < 1:
        raise ValueError(f"shards: expected a positive count, got {n}")
    mean = sum(durations.values()) / len(durations) if durations else 1.0
    weights = [durations.get(t, mean) if durations else 1.0 for t in ids]
    total, shards, done, k = sum(weights), [[] for _ in range(n)], 0.0, 0
    for i, (t, w) in enumerate(zip(ids, weights)):
        # the next shard once this one holds its share (a test's midpoint past it), or when only as many tests
        # are left as shards still empty
        if shards[k] and k < n - 1 and (done + w / 2 > total * (k + 1) / n or len(ids) - i <= n - 1 - k):
            k += 1
        shards[k].append(t)
        done += w
    return [s for s in shards if s]


def read_reports(path):
    """The JSON lines the plugin wrote (missing file: nothing ran)."""
    try:
        return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return []


def merge(shards, reports, logs):
    """One summary from every shard's reports: a test's outcome is its worst phase's (a failed teardown fails a
    passed test); tests with no report at all are 'not run'."""
    rank = {"passed": 0, "skipped": 1, "failed": 2}
    outcome, seconds, where = {}, {}, {}
    for k, rows in enumerate(reports):
        for r in rows:
            t = r["nodeid"]
            if rank[r["outcome"]] >= rank.get(outcome.get(t), -1):
                outcome[t] = r["outcome"]
            seconds[t] = seconds.get(t, 0.0) + r["duration"]
            where[t] = logs[k]
    selected = [t for s in shards for t in s]
    counts = {o: sum(1 for t in selected if outcome.get(t) == o) for o in ("passed", "failed", "skipped")}
    not_run = [t for t in selected if t not in outcome]
    return dict(selected=len(selected), **counts, not_run=not_run,
                failures=[dict(test=t, log=str(where[t])) for t in selected if outcome.get(t) == "failed"],
                durations={t: round(seconds[t], 3) for t in selected if t in seconds})


def run_shards(shards, out, timeout, env, extra, cwd=ROOT):
    """Start every shard at once, each in its own process group, and stop the ones still running at the limit."""
    procs = []
    for k, ids in enumerate(shards):
        rep, log = out / f"shard_{k}.jsonl", out / f"shard_{k}.log"
        rep.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", PLUGIN, *extra, *ids]
        with open(log, "w") as fh:
            p = subprocess.Popen(cmd, cwd=cwd, env={**env, REPORTS_ENV: str(rep)}, stdout=fh,
                                 stderr=subprocess.STDOUT, start_new_session=True) if ids else None
        procs.append((p, rep, log))
    deadline, timed_out, codes = time.monotonic() + timeout, [], []
    for k, (p, _, _) in enumerate(procs):
        if p is None:
            codes.append(0)
            continue
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            timed_out.append(k)
        codes.append(p.returncode)
    return [read_reports(rep) for _, rep, _ in procs], [log for _, _, log in procs], timed_out, codes


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="*", default=["tests"], help="test files or directories (default: tests)")
    ap.add_argument("--out", required=True, type=Path, help="folder for the shards' logs and summary.json")
    ap.add_argument("--shards", type=int, default=8,
                    help="parallel pytest processes (default 8: a tuner test compiles in up to 8 threads itself)")
    ap.add_argument("--timeout", type=float, default=540,
                    help="seconds from the start (collection included) before unfinished shards are stopped")
    ap.add_argument("--marker", default="gpu", help="pytest -m expression (default: gpu)")
    ap.add_argument("--balance", type=Path, help="a previous summary.json whose durations balance the shards")
    ap.add_argument("--rootdir", type=Path, default=ROOT,
                    help="run pytest from this folder (default: this checkout), where the node ids resolve")
    ap.add_argument("--interpret", action="store_true",
                    help="keep TRITON_INTERPRET=1 (checks this runner on a CPU machine with -m 'not gpu')")
    a = ap.parse_args(argv)
    if a.shards < 1:
        ap.error(f"--shards: expected a positive count, got {a.shards}")
    a.out.mkdir(parents=True, exist_ok=True)
    # each shard's tuner compiles in its share of the CPUs (a tuner test would otherwise start 8 threads in every
    # shard at once)
    workers = os.environ.get("EVTORCH_COMPILE_WORKERS") or str(max(1, (os.cpu_count() or 1) // a.shards))
    env = {**os.environ, "TRITON_INTERPRET": "1" if a.interpret else "0", "PYTHONUNBUFFERED": "1",
           "EVTORCH_COMPILE_WORKERS": workers,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    start = time.monotonic()
    ids = collect(a.paths, a.marker, env, a.rootdir)
    durations = json.loads(a.balance.read_text())["durations"] if a.balance else None
    shards = shard(ids, min(a.shards, max(1, len(ids))), durations)
    # the limit counts from the start, collection included (a device call's own limit cuts the whole command)
    left = max(1.0, a.timeout - (time.monotonic() - start))
    reports, logs, timed_out, codes = run_shards(shards, a.out, left, env, ["-m", a.marker], a.rootdir)
    summary = merge(shards, reports, logs)
    # pytest exits 0 (passed) or 1 (failures); anything else, outside a stop at the limit, is a crashed shard (a
    # CUDA error that aborts the process, a segfault): its remaining tests are listed as not run
    crashed = {k: codes[k] for k in range(len(shards)) if codes[k] not in (0, 1) and k not in timed_out}
    summary.update(seconds=round(time.monotonic() - start, 1), shards=len(shards), timed_out_shards=timed_out,
                   crashed_shards={str(k): c for k, c in crashed.items()}, marker=a.marker, paths=a.paths)
    (a.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"gpu_tests: {summary['passed']} passed, {summary['failed']} failed, {summary['skipped']} skipped, "
          f"{len(summary['not_run'])} not run of {summary['selected']} selected, {len(shards)} shards, "
          f"{summary['seconds']} s" + (f"; shards stopped at the {a.timeout:g} s limit: {timed_out}"
                                       if timed_out else ""))
    for k, code in crashed.items():
        print(f"  shard {k} exited with code {code} (log: {logs[k]})")
    for f in summary["failures"]:
        print(f"  FAILED {f['test']}  (log: {f['log']})")
    for t in summary["not_run"][:20]:
        print(f"  NOT RUN {t}")
    if len(summary["not_run"]) > 20:
        print(f"  ... and {len(summary['not_run']) - 20} more not run")
    return 0 if not summary["failures"] and not summary["not_run"] and not crashed else 1


if __name__ == "__main__":
    sys.exit(main())

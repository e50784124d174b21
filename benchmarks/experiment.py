"""Scaffolding of the one-lease device experiments (``fastmath_check``, ``pingpong_check``): the common command
line, phase 1's pool of worker processes, and the environment switches every experiment flips (``environ``,
``poisoned``: a poisoned call's output).

Why workers: Triton compiles on the CPU, one kernel at a time per process, and an experiment compiles dozens of
(workload, config) kernels; N processes sharing the on-disk Triton and evtorch caches compile them N at a time,
so the timing phase that follows (one process, the GPU to itself) only loads binaries. A worker is the
experiment's own module run as ``python -m <module> --worker i/N --jobs FILE --result FILE``: it takes every N-th
job of the JSON list and writes its records as JSON.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[1])


@contextlib.contextmanager
def environ(name: str, value: str):
    """``os.environ[name] = value`` inside, the old value (or its absence) back on exit, exception or not."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def poisoned(call):
    """``call()`` with evtorch's outputs poisoned before launch (``EVTORCH_POISON``): an element the kernel does not
    write then fails the check instead of passing on stale memory."""
    with environ("EVTORCH_POISON", "1"):
        return call()


def parser(name: str, deadline_s: float, phase1_s: float, workers: int) -> argparse.ArgumentParser:
    """Options every experiment takes (more can be added to the returned parser)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT") or f"{name}_out")
    ap.add_argument("--deadline-s", type=float, default=deadline_s)
    ap.add_argument("--phase1-s", type=float, default=phase1_s)
    ap.add_argument("--workers", type=int, default=workers)
    ap.add_argument("--scratch", default=f"/tmp/{name}_scratch")
    ap.add_argument("--dry-run", action="store_true", help="tiny sizes through the Triton interpreter on CPU")
    ap.add_argument("--worker", help="i/N: run as worker i of N (internal)")
    ap.add_argument("--jobs", help="the job list (internal)")
    ap.add_argument("--result", help="where a worker writes its records (internal)")
    return ap


def start_workers(module: str, args, jobs: list, log) -> tuple[list, object]:
    """Write ``jobs`` and start ``args.workers`` workers of ``module`` (their output in OUT/workers_log.txt).
    Returns (processes, log file); add other processes to the list to have ``finish_workers`` wait for them."""
    out, scratch = Path(args.out), Path(args.scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    (scratch / "jobs.json").write_text(json.dumps(jobs))
    logf = open(out / "workers_log.txt", "w")
    procs = []
    for i in range(args.workers):
        cmd = [sys.executable, "-m", module, "--worker", f"{i}/{args.workers}", "--jobs", str(scratch / "jobs.json"),
               "--result", str(scratch / f"w{i}.json"), "--out", str(out)]
        if args.dry_run:
            cmd.append("--dry-run")
        procs.append(subprocess.Popen(cmd, env=worker_env(), stdout=logf, stderr=subprocess.STDOUT, cwd=ROOT))
    log(f"phase 1: {len(jobs)} jobs on {args.workers} workers")
    return procs, logf


def worker_env(**extra) -> dict:
    """Environment of phase-1 processes: unbuffered, no autotuning (each job names its config)."""
    return dict(os.environ, PYTHONUNBUFFERED="1", EVTORCH_AUTOTUNE="0", **extra)


def finish_workers(args, procs: list, logf, t_start: float, log) -> list:
    """Wait for ``procs`` until ``args.phase1_s`` after ``t_start`` (then kill what is left), and return the
    workers' records."""
    for p in procs:
        try:
            p.wait(timeout=max(5.0, args.phase1_s - (time.time() - t_start)))
        except subprocess.TimeoutExpired:
            p.kill()
            log("phase 1: killed a process at the phase deadline")
    logf.close()
    res = []
    for i in range(args.workers):
        f = Path(args.scratch) / f"w{i}.json"
        if f.exists():
            res += json.loads(f.read_text())
    return res


def worker_share(args) -> list:
    """The jobs of this worker (``--worker i/N``): every N-th, from i."""
    jobs = json.loads(Path(args.jobs).read_text())
    i, n = (int(x) for x in args.worker.split("/"))
    return jobs[i::n]


def workload_rows(b, shapes, names, workload, skip_s: float, dtype=None, tag: str = "SKIP"):
    """Phase 2's loop: per shape (operands drawn once, seed 0; bf16 on a GPU, fp16 under the interpreter) and
    workload, ``(M, N, K, A, B, name, fn, inputs)``; a workload that would start with less than ``skip_s``
    seconds of the deadline left is logged and skipped. ``workload(name)`` gives ``(fn, make_inputs)``."""
    import torch

    from evtorch.examples import operands

    for (M, N, K) in shapes:
        torch.manual_seed(0)
        A, B = operands(M, N, K, b.dev, dtype or (torch.bfloat16 if b.cuda else torch.float16))
        for name in names:
            if b.time_left() < skip_s:
                b.log(tag, name, (M, N, K), "deadline")
                continue
            fn, make_inputs = workload(name)
            yield M, N, K, A, B, name, fn, make_inputs(M, N, b.dev, A.dtype)


def tuned_config(fn, A, B, inputs: dict):
    """Call ``evt.gemm(A, B, fn, **inputs)`` once (it tunes if ``EVTORCH_AUTOTUNE=1`` and this signature is new) and
    return the short name of the config its launch runs (None if there is no launch record)."""
    import torch

    import evtorch as evt
    import evtorch.runtime.gemm as rg
    from evtorch.api import get_epilogue

    evt.gemm(A, B, fn, **inputs)
    ep = get_epilogue(fn, tuple(A.shape[:-1]) + (B.shape[-1],), torch.float32, inputs)
    launch = rg._launches.get(rg.launch_key(ep, A, B, inputs, A.dtype, False, False, None))
    return launch.config.short() if launch is not None else None

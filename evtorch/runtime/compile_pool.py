"""Compile a tuning run's candidate kernels in worker processes, so that a first call waits for about the slowest
compile instead of their sum.

Why processes: a first call for a new shape compiles one kernel per tuning candidate (five in the bench), each a
Gluon or Triton compile of several seconds. Compiling them in threads (``autotune.PREPARE_WORKERS``) overlapped
little: much of Triton's compile (the Python front end, the MLIR passes' bindings) holds the GIL. On an H200 machine
the bench's 16 first calls took 8-22 s each, 265 s together (docs/benchmarks.md).

How, without re-deriving anything Triton decides: the tuner first runs each candidate once with Triton's
``jit_cache_hook`` installed (``collect``). The hook sees every compile Triton is about to do, with the kernel's
specialization serialized by Triton itself (argument types, 16-byte alignments, constexprs, options, target); it
records that and tells Triton to skip the compile, so nothing launches. The recorded jobs go to a pool of worker
processes (``compile_all``), each of which imports the same generated module (the same file, under the same module
name) and hands the data to ``JITFunction.preload``: the same compile, whose result lands in Triton's on-disk
cache. The tuner's ordinary runs then find every kernel there. Nothing depends on the workers succeeding: a job
that fails or is not done in time leaves the parent to compile that kernel itself, as before, and a hook that
cannot serialize a kernel's specialization makes that candidate's collect run fail, which is ignored likewise.

The hook is installed only while a tuner collects, and only the collecting thread's compiles are skipped: other
threads' compiles go through to whatever hook was there before.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from evtorch.runtime import knobs

_state = threading.local()
_hook_lock = threading.Lock()
_pool_lock = threading.Lock()
_pool: list = []  # of _Worker

#: Counts over this process's ``compile_all`` calls: jobs handed to workers, compiled there, failed there (the
#: parent then compiled them itself), seconds waited, and the last few errors. The bench records them.
STATS: dict = {"jobs": 0, "compiled": 0, "failed": 0, "wait_s": 0.0, "errors": []}


@dataclass(frozen=True)
class CompileJob:
    """One kernel compile, as Triton was about to do it: the generated module's file and name, the kernel's
    attribute name in it, Triton's serialized specialization, the CUDA device index and Triton's cache dir."""

    module_file: str
    module_name: str
    kernel: str
    specialization: str
    device_index: int
    triton_cache_dir: str | None


def workers() -> int:
    """Worker processes for candidate compiles (EVTORCH_COMPILE_WORKERS, default min(8, CPUs); 0: compile in the
    tuner's threads). Each worker holds a CUDA context (a few hundred MB of device memory) and a Python with torch
    and Triton imported; eight cover the bench's five candidates (a split-K candidate has two kernels)."""
    return knobs.COMPILE_WORKERS.get()


def _hook(previous):
    def hook(*, key, repr, fn, compile, is_manual_warmup, already_compiled, **more):  # noqa: A002 - Triton's names
        jobs = getattr(_state, "jobs", None)
        if jobs is None:  # another thread's compile: not ours to skip
            if previous is None:
                return None
            return previous(key=key, repr=repr, fn=fn, compile=compile, is_manual_warmup=is_manual_warmup,
                            already_compiled=already_compiled, **more)
        module = fn.module
        module = module if isinstance(module, str) else getattr(module, "__name__", str(module))
        jit = fn.jit_function
        source = getattr(jit, "fn", None)
        path = getattr(getattr(source, "__code__", None), "co_filename", None)
        index = compile.get("device")
        jobs.append(CompileJob(module_file=str(path), module_name=module, kernel=fn.name,
                               specialization=compile["specialization_data"],
                               device_index=index if isinstance(index, int) else 0,
                               triton_cache_dir=_triton_cache_dir()))
        return True  # skip the compile (and so the launch): a worker does it

    hook._evtorch_collect = True
    return hook


def _triton_cache_dir() -> str | None:
    try:
        import triton

        return str(triton.knobs.cache.dir)
    except Exception:  # noqa: BLE001 - older Triton: the workers read TRITON_CACHE_DIR like the parent
        return None


@contextlib.contextmanager
def collecting():
    """Within this block, the calling thread's kernel compiles are recorded (the list it yields) and skipped:
    their launches do nothing. Other threads compile and launch as usual."""
    import triton

    jobs: list[CompileJob] = []
    with _hook_lock:
        runtime = triton.knobs.runtime
        previous = runtime.jit_cache_hook
        runtime.jit_cache_hook = _hook(previous)
        _state.jobs = jobs
        try:
            yield jobs
        finally:
            _state.jobs = None
            runtime.jit_cache_hook = previous


def collect(runs: Sequence[Callable[[], object]]) -> list[CompileJob]:
    """The compiles each of ``runs`` would do, without doing them (a run that raises contributes what it
    recorded before raising: the caller's own run meets the same error later and reports it)."""
    found: list[CompileJob] = []
    seen: set[tuple[str, str, str]] = set()
    for run in runs:
        with collecting() as jobs:
            try:
                run()
            except Exception:  # noqa: BLE001 - see the docstring
                pass
        for job in jobs:
            ident = (job.module_name, job.kernel, job.specialization)
            if ident not in seen:
                seen.add(ident)
                found.append(job)
    return found


class _Worker:
    """One compile process, started with ``python -c`` rather than through ``multiprocessing``: a spawned
    multiprocessing child imports the parent's main script again, which would re-run a user's unguarded script
    (and its GPU work) in every worker. Jobs go in on its stdin, replies come back on its stdout (the worker points
    its own prints at stderr), each a length-prefixed pickle."""

    def __init__(self):
        env = dict(os.environ)
        env.pop("TRITON_INTERPRET", None)  # workers compile for the GPU even if a test set it in the parent
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # evtorch and whatever the kernels import
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from evtorch.runtime.compile_pool import _serve; _serve()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)

    def run(self, job: CompileJob) -> str | None:
        _send(self.proc.stdin, job)
        reply = _recv(self.proc.stdout)
        if reply is None:
            raise RuntimeError(f"compile worker exited with {self.proc.wait()}")
        return reply[0]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, kill: bool = False) -> None:
        with contextlib.suppress(OSError):
            self.proc.stdin.close()  # the worker's loop ends at end of input
        if kill:
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)


def _send(stream, obj) -> None:
    data = pickle.dumps(obj)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def _recv(stream):
    head = stream.read(8)
    if len(head) < 8:
        return None  # end of stream
    return pickle.loads(stream.read(struct.unpack("<Q", head)[0]))


def _workers_for(size: int) -> list[_Worker]:
    """The pool, grown to ``size`` live workers (dead ones replaced); callers hold ``_pool_lock``."""
    _pool[:] = [w for w in _pool if w.alive()]
    while len(_pool) < size:
        _pool.append(_Worker())
    return _pool[:size]


def start(size: int | None = None) -> None:
    """Start the worker processes now (each takes a few seconds to import torch and Triton), so that the first
    tuning run does not wait for them. Does nothing with 0 workers."""
    size = workers() if size is None else size
    if size > 0:
        with _pool_lock:
            _workers_for(size)


def shutdown() -> None:
    """Stop the worker processes (they are started again when needed)."""
    with _pool_lock:
        for worker in _pool:
            worker.stop()
        _pool.clear()


atexit.register(shutdown)


def compile_all(jobs: Sequence[CompileJob], timeout_s: float = 600.0) -> dict[CompileJob, str | None]:
    """Compile ``jobs`` in the worker processes; for each, None when it compiled, else the error's text. Jobs not
    finished within ``timeout_s`` are reported as such, and their workers stopped (the caller compiles them)."""
    size = workers()
    if not jobs or size <= 0:
        return {job: "compile workers disabled" for job in jobs}
    todo: queue.Queue = queue.Queue()
    for job in jobs:
        todo.put(job)
    out: dict[CompileJob, str | None] = {}
    t0 = time.monotonic()

    def drain(worker: _Worker) -> None:
        while True:
            try:
                job = todo.get_nowait()
            except queue.Empty:
                return
            try:
                out[job] = worker.run(job)
            except Exception as exc:  # noqa: BLE001 - a dead worker: its job goes back to the caller
                out[job] = f"{type(exc).__name__}: {exc}"
                return

    with _pool_lock:
        pool = _workers_for(min(size, len(jobs)))
        threads = [threading.Thread(target=drain, args=(w,), daemon=True) for w in pool]
        for thread in threads:
            thread.start()
        for worker, thread in zip(pool, threads):
            thread.join(max(0.0, t0 + timeout_s - time.monotonic()))
            if thread.is_alive():  # past the deadline: stop it (a fresh one replaces it next time)
                worker.stop(kill=True)
                thread.join(5)
    for job in jobs:
        out.setdefault(job, f"not compiled within {timeout_s:.0f} s")
    errors = [f"{job.kernel}: {err}"[:500] for job, err in out.items() if err is not None]
    STATS["jobs"] += len(out)
    STATS["failed"] += len(errors)
    STATS["compiled"] += len(out) - len(errors)
    STATS["wait_s"] = round(STATS["wait_s"] + time.monotonic() - t0, 3)
    STATS["errors"] = (STATS["errors"] + errors)[-8:]
    return out


def precompile(runs: Sequence[Callable[[], object]]) -> dict[CompileJob, str | None]:
    """``collect`` the compiles of ``runs`` and ``compile_all`` of them in the workers; what each job gave. Does
    nothing (an empty dict) without workers or without CUDA."""
    import torch

    if workers() <= 0 or not torch.cuda.is_available():
        return {}
    return compile_all(collect(runs))


# ---------------------------------------------------------------------------------------------- worker side


def _serve() -> None:
    """Worker main loop: compile each job read from stdin, reply on the original stdout, until end of input."""
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # prints (Triton's, a kernel's) go to stderr, never into the reply stream
    import torch  # noqa: F401 - the slow imports happen once, before the first job arrives
    import triton  # noqa: F401

    requests = sys.stdin.buffer
    while True:
        job = _recv(requests)
        if job is None:
            return
        _send(replies, (_compile(job),))


def _compile(job: CompileJob) -> str | None:
    """Worker: import the generated module and compile the kernel from Triton's serialized specialization."""
    try:
        import torch
        import triton

        from evtorch.runtime.source_cache import load_file

        if job.triton_cache_dir is not None:
            triton.knobs.cache.dir = job.triton_cache_dir
        kernel = getattr(load_file(job.module_file, job.module_name), job.kernel)
        torch.cuda.set_device(job.device_index)
        compiled = kernel.preload(job.specialization)
        # Loading it builds (and caches on disk) the C launcher of its signature: a compiler run of its own,
        # which the parent would otherwise do the first time it loads the kernel.
        init = getattr(compiled, "_init_handles", None)
        if init is not None:
            init()
        return None
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which compiles the kernel itself
        return f"{type(exc).__name__}: {exc}"

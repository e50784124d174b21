"""What every benchmark run shares: a results JSON written atomically, a log mirrored to stdout, a deadline,
and the two timers (``do_bench`` median with L2 flushed on CUDA, wall clock on CPU; and CUDA-graph replay,
which measures device time without host overhead)."""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path


class Harness:
    def __init__(self, args, stem: str, results: dict, *, cuda: bool, warmup_ms: float, rep_ms: float,
                 t0: float, cpu_reps: int = 3):
        import torch

        self.args, self.torch, self.cuda = args, torch, cuda
        self.stem, self.results, self.t0 = stem, results, t0
        self.warmup, self.rep, self.cpu_reps = warmup_ms, rep_ms, cpu_reps
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.logf = open(self.out / f"{stem}_log.txt", "w")

    def log(self, *parts):
        text = " ".join(str(p) for p in parts)
        print(text, flush=True)
        self.logf.write(text + "\n")
        self.logf.flush()

    def save(self):
        path = self.out / f"{self.stem}.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.results, indent=1, default=str))
        tmp.replace(path)

    def finish(self) -> int:
        """The experiment's last save and its running time in the log; the exit status (0)."""
        self.save()
        self.log(f"done in {time.time() - self.t0:.0f} s")
        return 0

    def time_left(self) -> float:
        return self.args.deadline_s - (time.time() - self.t0)

    def timer(self, fn, rep: float | None = None) -> float:
        """Median milliseconds of ``fn``: do_bench with L2 flushed on CUDA (``rep`` ms of repeats, default the
        harness's), wall clock on CPU."""
        if self.cuda:
            from triton.testing import do_bench

            return float(do_bench(fn, warmup=self.warmup, rep=self.rep if rep is None else rep,
                                  return_mode="median"))
        fn()
        times = []
        for _ in range(self.cpu_reps):
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
        return statistics.median(times)

    def paired(self, fns: dict, rounds: int = 5, settle_ms: float | None = None) -> dict:
        """Interleaved medians: ``rounds`` rounds, each timing every function of ``fns`` (name -> callable) with
        1/rounds of the repeats; name -> (median over the rounds, the rounds' times in round order). The tuner's
        final compares its finalists the same way: ``autotune.interleaved_ms`` runs the rounds (why interleaved,
        rotated, settled and with a discarded first round: its docstring; the evidence: docs/benchmarks.md, "The
        bench's rounds"). On CUDA the functions first settle together for ``settle_ms`` (default
        ``autotune.WARMUP_MS``) and one round is discarded; on CPU neither (wall-clock timing)."""
        from evtorch.runtime import autotune

        times = autotune.interleaved_ms(fns, rounds=rounds, settle_ms=settle_ms if self.cuda else 0,
                                        timer=lambda fn: self.timer(fn, rep=self.rep / rounds), discard=self.cuda)
        return {name: (statistics.median(ts), ts) for name, ts in times.items()}

    def capture(self, fn):
        """``fn`` captured whole in one CUDA graph (``autotune.capture``): the graph's replay callable; None where
        capture fails or without CUDA."""
        if not self.cuda:
            return None
        from evtorch.runtime.autotune import capture

        try:
            return capture(fn)
        except Exception as exc:  # noqa: BLE001 - a diagnostic, not a result
            self.log(f"  graph capture failed: {type(exc).__name__}: {str(exc)[:200]}")
            self.torch.cuda.synchronize()
            return None

    def graph_timer(self, fn) -> float | None:
        """Median ms of ``fn`` captured whole in one CUDA graph and replayed (device time without host
        overhead); None where capture fails or without CUDA."""
        replay = self.capture(fn)
        return None if replay is None else self.timer(replay)


def kernel_times(fn, calls: int = 20) -> dict:
    """CUDA kernel name -> microseconds per call of ``fn`` (torch.profiler over ``calls`` calls after a warm-up)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    out: dict = {}
    for ev in prof.key_averages():
        if ev.device_time_total > 0:
            out[ev.key[:80]] = round(ev.device_time_total / calls, 2)
    return out

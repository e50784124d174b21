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
        1/rounds of the repeats; name -> (median over the rounds, the rounds' times in round order). Clocks drift
        over seconds on the H200 (cuBLAS 0.75 and 0.82 ms for one product, before and after one row), so a ratio of
        two times taken one after the other carries the drift; interleaved, both see the same clocks.

        First the functions run in turn, untimed, for ``settle_ms`` (CUDA only; default ``autotune.WARMUP_MS``,
        the tuner's warm-up), queued back to back as the tuner settles a candidate (``autotune.settle``). A GPU that
        has just idled (a compile, the tuner's host work) does not reach its sustained clocks for about a second:
        with 300 ms of settling, the H100 runs of 2026-11-25/26 (132 rows, benchmarks/results/bench_h100_run*.json)
        timed cuBLAS's first round 3.7% above its row's median on average, and whatever was timed eighth, about
        a second into the load, 2.9% above it (evtorch's fourth round with two functions) and 8.8% (evtorch's
        third round with three). Each round also starts one function later than the last (round r times
        ``fns`` rotated by r), so what is left of such a disturbance does not fall on one function every time
        (docs/benchmarks.md, "The bench's rounds"). With 1.5 s of settling the first timing after it still came out
        3.8% above its median on average (cuBLAS's first round, 16 rows on an H200), so on CUDA one round is timed
        first and discarded."""
        from evtorch.runtime import autotune

        settle_ms = autotune.WARMUP_MS if settle_ms is None else settle_ms
        if self.cuda and settle_ms > 0:
            autotune.settle(lambda: [fn() for fn in fns.values()], settle_ms)
        names = list(fns)
        if self.cuda:
            for name in names:  # the discarded round
                self.timer(fns[name], rep=self.rep / rounds)
        times = {name: [] for name in names}
        for r in range(rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                times[name].append(self.timer(fns[name], rep=self.rep / rounds))
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

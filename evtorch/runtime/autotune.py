"""Pick the fastest GEMM config by timing candidates, remembering the answer on disk.

Why our own tuner instead of ``triton.autotune``: the kernel is generated per epilogue, the candidates span
different *templates* (different kernels and launch logic, split-K needs a second kernel and a workspace),
and results must persist across processes keyed by things Triton does not see (epilogue hash, layout
class). The caller supplies ``bench(config) -> ms`` (usually ``time_ms`` around ``launch_gemm``), so this
module knows nothing about kernels.

Keys bucket M, N, K to the next power of two: shapes in one bucket share a config (tuning every distinct
M of a dynamic-shape model would never end), while a 2x different size may get a different tile.
Timings live in EVTORCH_CACHE_DIR/autotune/<hash>.json, one file per key, written atomically, so
concurrent processes never corrupt each other (the last writer wins with an equally valid result).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import statistics
import threading
import time
import warnings
from typing import Callable, Hashable, Mapping, Sequence

import torch

from evtorch.codegen.configs import FEW_TILE_EDGE, GemmConfig, cdiv, device_info, next_pow2, tiles_128
from evtorch.runtime import knobs
from evtorch.runtime.source_cache import write_text_atomic

DEFAULT_MAX_CANDIDATES = 16

_lock = threading.Lock()
_memory: dict[str, GemmConfig] = {}


def shape_bucket(size: int) -> int:
    """Next power of two of ``size`` (0 stays 0, so K=0 never shares a config with K=1)."""
    if not isinstance(size, int) or size < 0:
        raise ValueError(f"size must be a non-negative int, got {size!r}")
    return 0 if size == 0 else next_pow2(size)


def problem_buckets(M: int, N: int, K: int, L: int, num_sms: int | None = None) -> tuple[int, int, int, int]:
    """The (M, N, K, L) a tuning result is shared by: powers of two (``shape_bucket``), except that a problem with
    fewer than ``num_sms`` tiles of 128x128 (less than one wave: ``configs.tiles_128``) has M and N above 128 rounded
    up to multiples of 128 instead, and L exact (the batch multiplies the tile count just as they do). Why: there
    the best tile and split depend on the exact tile count, which a power-of-two bucket spans up to 2x of:
    640x640x40960 and 768x768x49152 share the bucket 1024x1024x65536, and the split-K tuned for 768x768 (3 splits
    of 36 tiles, 1.20 x cuBLAS) ran 1.60 x cuBLAS at 640x640, where 5 splits of its 25 tiles ran 1.20 (H200,
    2026-11-28, docs/benchmarks.md "Split-K over TMA loads"). Above a wave the 128x256 persistent kernel is the
    regime and a tile more or less changes little. ``num_sms`` None: powers of two throughout."""
    pow2 = tuple(shape_bucket(v) for v in (M, N, K, L))
    if num_sms is None or tiles_128(M, N, L) >= num_sms:
        return pow2

    def edge(v: int, bucket: int) -> int:
        return bucket if v <= FEW_TILE_EDGE else cdiv(v, FEW_TILE_EDGE) * FEW_TILE_EDGE

    return edge(M, pow2[0]), edge(N, pow2[1]), pow2[2], L


def _triton_version() -> str:
    try:
        import triton

        return triton.__version__
    except Exception:  # noqa: BLE001 - tuning keys still work without the version
        return "unknown"


def tune_key(
    *,
    device_name: str,
    M: int,
    N: int,
    K: int,
    L: int,
    dtypes: Sequence[torch.dtype | str],
    layout: str,
    epilogue_hash: str,
    templates: Sequence[str],
    num_sms: int | None = None,
) -> str:
    """Canonical string key: GPU, Triton version, shape buckets (``problem_buckets``; ``num_sms``: the GPU's, for
    the few-tile buckets), dtypes, layout class, epilogue, templates."""
    for name, value in (("device_name", device_name), ("layout", layout), ("epilogue_hash", epilogue_hash)):
        if not isinstance(value, str):
            raise TypeError(f"{name} must be str, got {type(value).__name__}")
    dt = ",".join(str(d).replace("torch.", "") for d in dtypes)
    bm, bn, bk, bl = problem_buckets(M, N, K, L, num_sms)
    return (
        f"gpu={device_name}|triton={_triton_version()}|mnk={bm}x{bn}x{bk}|L={bl}|dtypes={dt}"
        f"|layout={layout}|epilogue={epilogue_hash}|templates={','.join(sorted(set(templates)))}"
    )


def make_tune_key(A: torch.Tensor, B: torch.Tensor, epilogue_hash: str, templates: Sequence[str],
                  extra_dtypes: Sequence[torch.dtype] = ()) -> str:
    """``tune_key`` filled from operands (``extra_dtypes``: e.g. epilogue output dtypes)."""
    from evtorch.runtime.gemm_launch import gemm_problem, layout_class

    p = gemm_problem(A, B)
    info = device_info(A.device)
    return tune_key(
        device_name=info.name, M=p.M, N=p.N, K=p.K, L=p.L, dtypes=(p.dtype, *extra_dtypes),
        layout=layout_class(A, B), epilogue_hash=epilogue_hash, templates=templates, num_sms=info.num_sms,
    )


# A GPU that idled (say, through the compile of the candidate about to be timed) runs its first tens of
# milliseconds of heavy work at a higher clock than under sustained load: on an H200, cuBLAS at 8192x8192x4096
# took 0.70 ms timed cold and 0.82 ms as sustained graph replays, and a bench's tuner ranked ping-pong configs
# 6-11% below what the same bench then measured (docs/benchmarks-log.md, "Reductions as floats"). So every candidate is
# timed after SETTLE_MS of running it: all of them in the sustained state.
SETTLE_MS = 200

# One timing per candidate ranks near-equal candidates by noise: on an H200 at 8192x8192x4096 one config's timings
# spread over 5-10% from round to round, and the bench's picks among configs within ~4% of each other changed
# between runs (docs/benchmarks.md, "Measuring"). So the candidates within REFINE_MARGIN of the fastest (at most
# REFINE_MAX), and always the two fastest, are timed REFINE_ROUNDS more times, interleaved, and the lowest median
# wins. (The two fastest always: a first timing can also be far too fast. In the 07:40 UTC run the tuner timed two
# picked configs at 0.75-0.76 ms that the bench then measured at 0.87 ms, and with no other candidate within 5% of
# such an outlier nothing was timed again.) A second look at every candidate within 20% of the fastest, in the
# reverse order, was tried on an H100 (2026-11-26): its picks cost no less than these within the noise of the
# re-timing, and it added ~2 s to every first call (docs/benchmarks-log.md, "The tuner's warm-up").
REFINE_MARGIN = 0.05
REFINE_MAX = 3
REFINE_ROUNDS = 2

# The first pass is biased between templates: timed alone after SETTLE_MS of itself, the persistent kernel comes
# out faster, against the ping-pong configs, than it runs in the final's interleaved rounds (first-pass time over
# final median, H100, 8192x8192x4096, 2026-11-27 02:18 UTC: persistent finalists 0.945-0.998, median 0.971;
# ping-pong ones 0.967-1.022, median 0.988). In that bench bias_gelu_aux's three fastest first timings were all
# persistent configs, the best ping-pong config came fifth at 1.021 of the fastest, the final never saw it, and the
# pick ran at 1.011 of torch.compile's time (ping-pong picks: 0.966-0.979). So the fastest candidate of every other
# template within TEMPLATE_MARGIN of the fastest goes to the final second (docs/benchmarks.md, "Compiles under load,
# and the final's context").
TEMPLATE_MARGIN = 0.08

# The final: where the caller can run a candidate's call (``pick_config``'s ``final``), the refine's candidates
# (``_close``: the fastest first timing, each other template's fastest within TEMPLATE_MARGIN, the runner-up and
# the next within REFINE_MARGIN, REFINE_MAX in all) are not timed again one by
# one but in the bench's interleaved rounds (``interleaved_ms``): run in turn for FINAL_SETTLE_MS, one round timed
# and discarded, then FINAL_ROUNDS rounds of FINAL_REP_MS each, every round starting one candidate later; the lowest
# median over the rounds wins. Why: a timing of one candidate alone, after SETTLE_MS of running itself, ranks the
# two Hopper templates differently from how they run beside other work. On an H100 at 8192x8192x4096 (2026-11-27,
# benchmarks/tuner_state.py, docs/benchmarks.md "The tuner's final") a first call timed the persistent kernel for
# bias_gelu_aux 0.06% ahead of the best ping-pong config, and interleaved rounds taken right after the tuning, and
# again 10, 30 and 60 s later, put it 2.0-3.8% behind; it had been level with torch.compile in two full benches
# where the tuner picked it. With the final, three full benches picked ping-pong there (0.966-0.979 of
# torch.compile's time), and for every other fused row at that shape. The final settles for FINAL_SETTLE_MS,
# not WARMUP_MS: the first pass has just kept the GPU busy, and
# WARMUP_MS is for a GPU coming out of the compiles' idle. It costs FINAL_SETTLE_MS + 6 x REFINE_MAX x
# (25 + FINAL_REP_MS) ms or so, about what the REFINE_ROUNDS re-timings cost (SETTLE_MS + 125 ms each): a bench's
# 16 first calls took 160.6 s and 186.5 s with it on two H100 machines, 167.4 s before it.
FINAL_ROUNDS = 5
FINAL_REP_MS = 50.0
FINAL_SETTLE_MS = 500.0

# FINAL_BETWEEN: in the final every timing of a finalist follows a timing of cuBLAS's product of the operands
# (``interleaved_ms``'s ``between``; gemm.py passes the same call as the compile-time ``load``), as each of the
# bench's timings follows another GEMM's and as a GEMM in a model follows other kernels. What a finalist follows
# changes its time: after 1.5 s of cuBLAS the ping-pong pick for bias_gelu_aux ran 5.5% faster than after 1.5 s of
# itself and the persistent configs 0-1.5% (H100, benchmarks/tuner_timing.py, docs/benchmarks.md "The bench's
# rounds"), and in the H200 bench of 2026-11-27 02:30 UTC a final of two persistent configs and one ping-pong
# config, each following the others, put the persistent flattened halves 1.6% ahead (0.8719 against 0.8862 ms);
# the bench, timing it after cuBLAS and torch.compile, then measured 0.8953 ms, 1.030 of torch.compile's time.
# It doubles the final's timings: 1.9 -> 3.3 s per first call at that shape; the next bench picked ping-pong there,
# 0.949 of torch.compile's time (docs/benchmarks-log.md, "Compiles under load, and the final's context").
FINAL_BETWEEN = True

# Before the first pass the GPU runs the first candidate for WARMUP_MS, untimed. The candidates' compile leaves it
# idle for seconds, and the first second of load after that is not the sustained state the bench (and a training
# loop) sees: on an H100 at 8192x8192x4096 (2026-11-26, benchmarks/results/first_call_h100_second_look.json) the
# first candidate's first timing came out 3.6-5.4% below its later timings in all four rows, and the third's
# 13-21% above (a clock dip after the burst; the older run in first_call_h100_retime.json shows both too), so the
# first candidate in the list, the persistent kernel there, won ties it loses in the bench. After this warm-up
# the third's first timings lay within 0.94-1.01 of its later ones, the first's 0.92-0.99 (docs/benchmarks.md,
# "The tuner's warm-up"). SETTLE_MS settles one candidate's own clock; it is too short for this.
WARMUP_MS = 1500.0

# Candidates are compiled in a pool of threads before any is timed (``pick_config``'s ``prepare``): a first call
# for a new shape then waits for about the slowest compile plus what the compiles hold the GIL for, not their sum.
# (Worker processes were tried, fed through Triton's jit_cache_hook and JITFunction.preload: on the H200 machine the
# five candidates' compile phase took 4.5-6.4 s that way against 2.4-3.7 s in threads, docs/benchmarks.md.)
# How many threads: ``EVTORCH_COMPILE_WORKERS`` (default 8), at most the CPU count.

# The compiles leave the GPU idle for seconds (4.8-7.5 s for nine candidates from cold caches on an H100,
# benchmarks/results/first_call_h100_*.json), and WARMUP_MS of load after them brings it back to the sustained
# state. Where the caller can name a call that loads the GPU as the candidates will (``pick_config``'s ``load``;
# gemm.py: cuBLAS's product of the operands, a GEMM of the same size at the same power cap), it runs during the
# compiles instead: repeated in a CUDA graph of about LOAD_GRAPH_MS (at most LOAD_GRAPH_CALLS calls), replayed
# with at most two graphs in flight, so the thread keeping the GPU busy needs the GIL the compiling threads hold
# once per LOAD_GRAPH_MS, not once per call. The warm-up after the compiles is then what is left of WARMUP_MS,
# at least WARMUP_MIN_MS on the first candidate (the switch from cuBLAS to it, and the compile's last gap).
LOAD_GRAPH_MS = 10.0
LOAD_GRAPH_CALLS = 256
WARMUP_MIN_MS = 300.0


# A call shorter than GRAPH_BELOW_MS is timed as one call captured in a CUDA graph (its host work left out) and
# replayed with L2 flushed before every replay: the bench's kernel column, so the tuner ranks by the statistic the
# bench reports. Until 2026-11-25 it used ``do_bench_cudagraph``, which replays the call back to back without a
# flush. Re-timing every candidate of seven bench workloads at 8192x4096x1024 both ways against the bench's own
# measurement, in interleaved rounds on an H100 (benchmarks/tuner_timing.py, docs/benchmarks.md "The tuner's timing
# conditions"): the flushed replays' picks cost 1.000-1.009 of the bench's best, the back-to-back replays' 1.000-1.032.
# (Single flushed timings scatter more: 16 of 327 lay over 5% above their candidate's other two, against 8.)

# The tuner times a candidate the way the public call runs it where that is possible: graph replays only for calls
# shorter than this, where host time would otherwise rank the candidates; longer calls are timed themselves, with
# L2 flushed as the bench does. (On the H200 at 8192x8192x4096 the persistent kernel's public call for
# bias_gelu_aux measured 1.4-3.8% over its graph replays in four runs, level in a fifth: benchmarks/launch_paths.py,
# docs/benchmarks.md "First calls and the tuner's timing".)
GRAPH_BELOW_MS = 0.25


def interleaved_ms(fns: Mapping[Hashable, Callable[[], object]], *, rounds: int = FINAL_ROUNDS,
                   settle_ms: float | None = None, timer: Callable[[Callable[[], object]], float] | None = None,
                   discard: bool = True, graph: bool | str = False,
                   between: Callable[[], object] | None = None) -> dict[Hashable, list[float]]:
    """Interleaved timings of several functions: name -> the times of its ``rounds`` rounds, in round order.

    Clocks drift over seconds under a power cap (cuBLAS 0.75 and 0.82 ms for one product on an H200, before and
    after one bench row), so two times taken one after the other carry the drift; timed in turn, round after
    round, every function sees the same clocks. First the functions run in turn, untimed, for ``settle_ms``
    (default WARMUP_MS; 0 skips it): a GPU that has just idled does not reach its sustained clocks for about a
    second. Then (``discard``) one round is timed and thrown away: the first timing after the settling still ran
    3.8% above its median on average (cuBLAS's first round over 16 rows on an H200). Round r starts with the
    functions rotated by r, so what is left of a disturbance at a fixed point of the sequence does not fall on one
    function every time (docs/benchmarks-log.md, "The bench's rounds").

    ``timer(fn) -> ms`` times one function once; default ``do_bench`` (L2 flushed before every run, median over
    FINAL_REP_MS of repeats). ``graph="auto"``: when the functions average under GRAPH_BELOW_MS per call while
    settling, every one is captured in a CUDA graph (``capture``) and its replays are timed, leaving out host
    work, as ``time_ms`` does for one function; all or none, so that the times compare.

    ``between``: a call timed the same way (its times thrown away) before every timing of a function, in the
    settling too, so that each timing follows another kernel's as in the bench's rounds (FINAL_BETWEEN)."""
    if timer is None:
        from triton.testing import do_bench

        def timer(fn):
            return float(do_bench(fn, warmup=25, rep=FINAL_REP_MS, return_mode="median"))

    names = list(fns)
    plain = {**fns, _BETWEEN: between} if between is not None else dict(fns)
    calls = dict(plain)
    settle_ms = WARMUP_MS if settle_ms is None else settle_ms
    per_call = settle(lambda: [c() for c in calls.values()], settle_ms) / len(calls) if settle_ms > 0 else None
    if graph == "auto":
        graph = per_call is None or per_call < GRAPH_BELOW_MS
    if graph:
        try:
            calls = {n: capture(c) for n, c in plain.items()}
        except Exception:  # noqa: BLE001 - one is not capturable: time all of them plainly
            if torch.cuda.is_initialized():
                torch.cuda.synchronize()
            calls = dict(plain)

    def timed(n: Hashable) -> float:
        if between is not None:
            timer(calls[_BETWEEN])
        return timer(calls[n])

    if discard:
        for n in names:
            timed(n)
    times: dict[Hashable, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            times[n].append(timed(n))
    return times


_BETWEEN = object()  # interleaved_ms's key for its ``between`` call


def settle(fn: Callable[[], object], ms: float) -> float:
    """Run ``fn`` back to back for about ``ms`` milliseconds, at least once: one call sizes a batch, the rest are
    queued without waiting for each. (With a synchronize after every call the GPU idled through each call's host
    work, below its sustained power draw; in the 07:31 UTC run, benchmarks/results/bench_h200_run0731.json, the
    tuner timed the picked configs at 8192x8192x4096 1-12% faster than the bench then measured them.) Returns the
    milliseconds per call of the last batch (device time where the GPU is the bottleneck)."""
    import time

    torch.cuda.synchronize()
    start = time.perf_counter()
    batch = 1
    while True:
        t = time.perf_counter()
        for _ in range(batch):
            fn()
        torch.cuda.synchronize()
        now = time.perf_counter()
        left = ms - (now - start) * 1e3
        per_call = max((now - t) * 1e3 / batch, 1e-3)
        if left <= 0:
            return per_call
        batch = max(1, min(int(left / per_call) + 1, 4096))


def capture(fn: Callable[[], object]) -> Callable[[], None]:
    """``fn`` captured once in a CUDA graph: the graph's replay callable. ``fn`` first runs twice on a side stream
    (lazy initialisation, compiles and first-call allocations must not happen inside the capture). Raises where
    ``fn`` cannot be captured (a host synchronization, an op CUDA graphs do not support)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def time_ms(fn: Callable[[], object], warmup_ms: int = 25, rep_ms: int = 100, graph: bool | str = False,
            settle_ms: float = SETTLE_MS) -> float:
    """Median run time of ``fn`` in milliseconds via ``triton.testing.do_bench`` (CUDA-event timed, L2 flushed
    before every run), after ``settle_ms`` of running it (``SETTLE_MS``). ``graph=True``: time one call of ``fn``
    captured in a CUDA graph (``capture``) instead, which leaves out the host work of the call: a public call takes
    ~0.1 ms of host time, so below ~0.1 ms of kernel, plain timing ranks the candidates by noise (docs/benchmarks.md:
    a 2048^3 GEMM picked 94% or 77% of cuBLAS from run to run). ``graph="auto"``: graph replays for calls shorter
    than GRAPH_BELOW_MS (as measured while settling), plain timing of the call itself for longer ones, whose host
    work the GPU hides. Falls back to plain timing when ``fn`` cannot be captured."""
    from triton.testing import do_bench

    per_call = settle(fn, settle_ms) if settle_ms > 0 else None
    if graph == "auto":
        graph = per_call is None or per_call < GRAPH_BELOW_MS
    if graph:
        try:
            fn = capture(fn)
        except Exception:  # noqa: BLE001 - not capturable (a host sync, an unsupported op): time it plainly
            torch.cuda.synchronize()
    return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


def _cache_file(key: str):
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]
    return knobs.cache_dir() / "autotune" / f"{digest}.json"


def load_cached(key: str) -> GemmConfig | None:
    """Best config stored for ``key`` (memory first, then disk), or None."""
    with _lock:
        if key in _memory:
            return _memory[key]
    path = _cache_file(key)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("key") != key:  # hash-prefix collision or foreign file
            return None
        config = GemmConfig.from_dict(data["best"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        # corrupt (JSON that is not an object, too), from an incompatible version, or not a readable file: retune
        warnings.warn(f"ignoring unreadable autotune cache {path}: {type(exc).__name__}: {exc}", stacklevel=2)
        return None
    with _lock:
        _memory[key] = config
    return config


def store(key: str, best: GemmConfig, timings: dict[str, float],
          candidates: Sequence[GemmConfig] = (), label: str = "",
          samples: dict[str, list[float]] | None = None, final: dict[str, list[float]] | None = None,
          phases: dict[str, float] | None = None) -> None:
    """Record ``best`` for ``key`` in memory and on disk (atomic write), with every candidate's timing and, for
    ``candidates``, its whole config and their timing order (so the file says what was tried: ``stored_records``);
    ``label`` says in words what was tuned (the key names the epilogue by a hash and the shape by its bucket).
    ``samples``: every timing of each candidate in the order taken (first pass, then any one-by-one re-timings), so that
    a pick can be traced to the timings behind it (docs/benchmarks-log.md, "The tuner's final"). ``final``: the finalists'
    round times when the final (FINAL_ROUNDS) picked ``best``. ``phases``: the tuning's phases in seconds
    (``pick_config``)."""
    def finite(ms: float) -> float | None:
        return ms if math.isfinite(ms) else None

    payload = {
        "key": key,
        "label": label,
        "best": best.to_dict(),
        "timings_ms": {name: finite(ms) for name, ms in timings.items()},
        "candidates": {c.short(): c.to_dict() for c in candidates},
        "order": [c.short() for c in candidates],
        "samples_ms": {name: [finite(ms) for ms in runs] for name, runs in (samples or {}).items()},
        "final_ms": final or {},
        "phases_s": {name: round(sec, 3) for name, sec in (phases or {}).items()},
    }
    with _lock:
        _memory[key] = best
    try:
        write_text_atomic(_cache_file(key), json.dumps(payload, indent=1, sort_keys=True))
    except OSError as exc:  # a cache that cannot be written costs the next process a retune, not this call its pick
        warnings.warn(f"{knobs.CACHE_DIR.name}={knobs.cache_dir()}: cannot store the autotune result for "
                      f"{label or key} ({type(exc).__name__}: {exc}); it is kept for this process only", stacklevel=2)


def key_fields(key: str) -> dict[str, str]:
    """The fields of a ``tune_key`` string (gpu, triton, mnk, L, dtypes, layout, epilogue, templates)."""
    return dict(part.split("=", 1) for part in key.split("|") if "=" in part)


def stored_records() -> list[dict]:
    """Every tuning result stored under the cache directory: ``key``, ``label``, ``path``, ``best``, ``candidates``
    (name -> GemmConfig; empty for records written before 2026-11-25), ``timings_ms`` (name -> ms, None for a
    candidate that failed), ``order`` (the names in timing order) and ``samples_ms`` (name -> every timing in the
    order taken; both empty for records written before 2026-11-26) and ``final_ms`` (finalist -> its round
    times, when the final picked ``best``; empty otherwise and before 2026-11-27) and ``phases_s`` (the tuning's
    phases in seconds; empty before 2026-11-27 02:00 UTC). Files this version cannot read are skipped.
    (``evtorch tuning`` prints them.)"""
    records = []
    for path in sorted((knobs.cache_dir() / "autotune").glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            records.append({
                "key": data["key"], "label": data.get("label", ""), "path": path,
                "best": GemmConfig.from_dict(data["best"]),
                "timings_ms": data["timings_ms"],
                "candidates": {name: GemmConfig.from_dict(d) for name, d in data.get("candidates", {}).items()},
                "order": data.get("order", []), "samples_ms": data.get("samples_ms", {}),
                "final_ms": data.get("final_ms", {}), "phases_s": data.get("phases_s", {})})
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return records


def should_tune(device: torch.device | str | int | None = None) -> bool:
    """Tuning runs only with EVTORCH_AUTOTUNE on and a real CUDA device (never on CPU/interpreter)."""
    return knobs.autotune_enabled() and device_info(device).kind == "cuda"


def pick_config(
    candidates: Sequence[GemmConfig],
    bench: Callable[[GemmConfig], float],
    *,
    key: str,
    heuristic: GemmConfig,
    device: torch.device | str | int | None = None,
    max_candidates: int = DEFAULT_MAX_CANDIDATES,
    progress: bool = True,
    prepare: Callable[[GemmConfig], object] | None = None,
    label: str = "",
    final: Callable[[Sequence[GemmConfig]], dict[GemmConfig, list[float]]] | None = None,
    load: Callable[[], object] | None = None,
) -> GemmConfig:
    """The fastest of ``candidates`` by ``bench(config) -> ms``, cached under ``key``: after WARMUP_MS of running
    the first candidate, every candidate timed once and the best few (``_close``) again, the lowest median wins.
    With ``final`` (usually ``interleaved_ms`` over the candidates' calls), those few are not re-timed by
    ``bench`` but by ``final(finalists) -> {config: round times}`` in interleaved rounds, and the lowest median of
    the rounds wins (see FINAL_ROUNDS for why). A ``final`` that raises or returns a non-finite time is warned
    about, and the re-timing by ``bench`` takes its place.

    ``prepare(config)``, when given, is first called for every candidate in a pool of threads
    (EVTORCH_COMPILE_WORKERS; a run that compiles its kernels); what it raises is ignored here (``bench`` meets
    the same failure and records it). ``load()``, when given, keeps the GPU busy meanwhile (LOAD_GRAPH_MS), and shortens the warm-up after the
    compiles by as long as it ran (down to WARMUP_MIN_MS). The record keeps how long each phase took
    (``phases_s``: compile, loaded (during the compile), warm_up, first_pass, final (or the re-timings)).

    Returns ``heuristic`` without timing anything when tuning is off (EVTORCH_AUTOTUNE=0) or the device is
    not CUDA (CPU, Triton interpreter). Candidates beyond ``max_candidates`` are dropped (order them best
    guess first) so a tuning run stays within seconds. A candidate whose ``bench`` raises (e.g. Triton's
    OutOfResources) is skipped; if all fail, the heuristic is returned and nothing is cached.
    ``bench`` may run the kernel many times: epilogues that accumulate (atomics) must be re-zeroed by it.
    ``label`` is stored with the result (``store``) for people reading it (``evtorch tuning``).
    """
    if not isinstance(heuristic, GemmConfig):
        raise TypeError(f"heuristic must be a GemmConfig, got {type(heuristic).__name__}")
    if not should_tune(device):
        return heuristic
    cands = list(candidates)[:max_candidates]
    if not cands:
        raise ValueError("candidates must contain at least one GemmConfig")
    for c in cands:
        if not isinstance(c, GemmConfig):
            raise TypeError(f"candidates must be GemmConfig objects, got {type(c).__name__}")
    cached = load_cached(key)
    if cached is not None:
        return cached

    from tqdm.auto import tqdm

    phases: dict[str, float] = {}
    loaded_ms = 0.0
    if prepare is not None and len(cands) > 1:
        with _phase(phases, "compile"):
            loaded_ms = _prepare_all(cands, prepare, load)
        phases["loaded"] = loaded_ms / 1e3
    if len(cands) > 1:  # one candidate is not ranked
        with _phase(phases, "warm_up"):
            _warm_up(cands, bench, min(WARMUP_MS, max(WARMUP_MIN_MS, WARMUP_MS - loaded_ms)))
    samples: dict[GemmConfig, list[float]] = {}
    errors: dict[str, str] = {}
    with _phase(phases, "first_pass"), tqdm(cands, desc="evtorch autotune", unit="cfg", leave=False,
                                   disable=not progress) as bar:
        _time_pass(cands, bench, samples, errors, bar)
    ok = [c for c in cands if samples[c][0] < math.inf]
    if not ok:
        warnings.warn(f"every autotune candidate failed for {key}; using the heuristic config. Errors: {errors}",
                      stacklevel=2)
        return heuristic
    close = _close(ok, samples)
    with _phase(phases, "final"):
        rounds = _time_final(close, final) if final is not None and len(close) > 1 else {}
        if not rounds and len(close) > 1:
            for _ in range(REFINE_ROUNDS):
                _time_pass(close, bench, samples, errors)
    timings = {c.short(): statistics.median(samples[c]) for c in cands}  # every candidate ran in the first pass
    if rounds:  # earlier wins ties (min keeps the first; the finalists are in _close's order)
        best = min(rounds, key=lambda c: statistics.median(rounds[c]))
    else:
        best = min(ok, key=lambda c: timings[c.short()])
    store(key, best, timings, cands, label, {c.short(): samples[c] for c in cands},
          {c.short(): ts for c, ts in rounds.items()}, phases)
    return best


@contextlib.contextmanager
def _phase(phases: dict[str, float], name: str):
    """``with _phase(phases, name):`` adds the block's wall seconds to ``phases[name]`` (a record's ``phases_s``)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        phases[name] = phases.get(name, 0.0) + time.perf_counter() - start


def _warm_up(cands: Sequence[GemmConfig], bench: Callable[[GemmConfig], float], ms: float) -> None:
    """Run ``bench`` on the first candidate that does not fail until ``ms`` have passed (at least once, where
    ``ms`` > 0); results discarded."""
    start = time.perf_counter()
    for cfg in cands:
        try:
            while (time.perf_counter() - start) * 1e3 < ms:
                bench(cfg)
            return
        except Exception:  # noqa: BLE001 - the first pass records the failure; warm up on the next candidate
            continue


def _time_pass(cands: Sequence[GemmConfig], bench: Callable[[GemmConfig], float],
               samples: dict[GemmConfig, list[float]], errors: dict[str, str], bar=None) -> None:
    """Time each of ``cands`` once, in order, appending to ``samples``; a candidate that raises gets inf and is
    recorded in ``errors`` (a later pass skips it: a failing candidate must not abort tuning, nor be timed again).
    ``bar``: the progress bar iterating ``cands``, which shows the best timing so far."""
    best = math.inf
    for cfg in (bar if bar is not None else cands):
        if samples.get(cfg) and samples[cfg][-1] == math.inf:
            continue
        try:
            ms = float(bench(cfg))
        except Exception as exc:  # noqa: BLE001 - a failing candidate must not abort tuning
            ms = math.inf
            errors[cfg.short()] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        samples.setdefault(cfg, []).append(ms)
        if ms < best and bar is not None:
            best = ms
            bar.set_postfix_str(f"best {best:.3f} ms {cfg.short()}")


def _close(ok: Sequence[GemmConfig], samples: dict[GemmConfig, list[float]]) -> list[GemmConfig]:
    """The candidates timed again (see REFINE_MARGIN), REFINE_MAX at most: the fastest first timing of ``ok``, then
    the fastest of each other template within TEMPLATE_MARGIN of it, then the runner-up and the next ones within
    REFINE_MARGIN, each group fastest first (stable: earlier candidates first among equal timings)."""
    ranked = sorted(ok, key=lambda c: samples[c][0])
    best = samples[ranked[0]][0]
    picked = [ranked[0]]
    for c in ranked:
        if c.template not in {p.template for p in picked} and samples[c][0] <= best * (1 + TEMPLATE_MARGIN):
            picked.append(c)
    picked += [c for i, c in enumerate(ranked)
               if c not in picked and (i < 2 or samples[c][0] <= best * (1 + REFINE_MARGIN))]
    return picked[:REFINE_MAX]


def _time_final(finalists: Sequence[GemmConfig],
                final: Callable[[Sequence[GemmConfig]], dict[GemmConfig, list[float]]]
                ) -> dict[GemmConfig, list[float]]:
    """``final(finalists)`` (see FINAL_ROUNDS): each finalist's round times, in the finalists' order; {} with a
    warning when ``final`` raises or leaves a finalist without a finite time (the caller re-times them by
    ``bench`` then)."""
    try:
        rounds = final(finalists)
        rounds = {c: [float(ms) for ms in rounds[c]] for c in finalists}
    except Exception as exc:  # noqa: BLE001 - the re-timing by bench takes its place
        warnings.warn(f"autotune final failed ({type(exc).__name__}: {exc}); re-timing the finalists one by one",
                      stacklevel=3)
        return {}
    if not all(ts and all(math.isfinite(ms) for ms in ts) for ts in rounds.values()):
        warnings.warn("autotune final returned no finite timings for some finalist; re-timing the finalists one "
                      "by one", stacklevel=3)
        return {}
    return rounds


def _prepare_all(cands: Sequence[GemmConfig], prepare: Callable[[GemmConfig], object],
                 load: Callable[[], object] | None = None) -> float:
    """``prepare`` every candidate in a thread pool, each on the caller's CUDA stream (so that its launches order
    with the caller's work, as the timing's will), while this thread keeps the GPU busy with ``load`` (see
    LOAD_GRAPH_MS) where given and capturable. Returns the milliseconds it kept the GPU busy (0 without it)."""
    from concurrent.futures import ThreadPoolExecutor

    stream = torch.cuda.current_stream() if torch.cuda.is_available() else None

    def run(cfg: GemmConfig) -> None:
        try:
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                prepare(cfg)
        except Exception:  # noqa: BLE001 - bench() meets the same failure and records it
            pass

    replay = load_graph(load) if load is not None else None  # captured before any worker touches the GPU
    with ThreadPoolExecutor(max_workers=min(len(cands), knobs.compile_workers(), os.cpu_count() or 1)) as pool:
        futures = [pool.submit(run, cfg) for cfg in cands]
        busy_ms = busy_until(replay, lambda: all(f.done() for f in futures)) if replay is not None else 0.0
        for f in futures:
            f.result()
    return busy_ms


def load_graph(load: Callable[[], object]) -> Callable[[], object] | None:
    """``load`` repeated in one CUDA graph lasting about LOAD_GRAPH_MS: the graph's replay callable; None on a
    machine without CUDA, or where ``load`` fails or cannot be captured (e.g. a dtype cuBLAS has no product for),
    so that the caller warms up the GPU afterwards instead."""
    if not torch.cuda.is_available():
        return None
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # first calls (cuBLAS handles, workspaces) outside the capture
            load()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(3):
                load()
            end.record()
        end.synchronize()
        per_call = max(start.elapsed_time(end) / 3, 1e-3)
        calls = max(1, min(LOAD_GRAPH_CALLS, math.ceil(LOAD_GRAPH_MS / per_call)))
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                load()
        return graph.replay
    except Exception:  # noqa: BLE001 - no load then: the warm-up after the compiles does it all
        torch.cuda.synchronize()
        return None


def busy_until(replay: Callable[[], object], done: Callable[[], bool]) -> float:
    """Call ``replay`` (a CUDA graph's) over and over, at most two in flight, until ``done()``; returns the
    milliseconds this took. Waiting on the older replay's event lets go of the GIL, so the threads that compile
    run meanwhile."""
    from collections import deque

    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    start = time.perf_counter()
    in_flight: deque = deque()
    while not done():
        replay()
        if cuda:
            event = torch.cuda.Event()
            event.record()
            in_flight.append(event)
            if len(in_flight) > 1:
                in_flight.popleft().synchronize()
    if in_flight:
        in_flight[-1].synchronize()
    return (time.perf_counter() - start) * 1e3


def clear_memory_cache() -> None:
    """Forget in-memory results (disk files stay). For tests."""
    with _lock:
        _memory.clear()

"""``evtorch bench``: fused GEMM + epilogue against cuBLAS, eager PyTorch and torch.compile (issue 4).

One command, one process, sized for one device call (about 6 to 8 minutes on an H100/H200)::

    PYTHONUNBUFFERED=1 evtorch bench --out $OUT            # or: python -m benchmarks.run --out $OUT
    evtorch bench --dry-run                                 # CPU: Triton interpreter, tiny sizes, no GPU

Per workload (benchmarks/workloads.py) and shape (M, N, K), bf16 A and B, fp32 accumulation, random data:

- ``evt``: ``evt.gemm(A, B, fn, **inputs)``, the public call (host work included), autotuned
  (EVTORCH_AUTOTUNE=1, at most ``--candidates`` configs, fresh tuning cache: the first call's time is reported);
- ``evt_kernel``: the same call captured in a CUDA graph and replayed (device time only);
- ``cublas``: ``torch.matmul(A, B)`` alone (bf16 out), the target: evt / cublas <= 1.05 (large), 1.15 (small K);
- ``eager``: ``fn(A @ B, **inputs)``; ``compile``: the same under ``torch.compile(mode=--compile-mode)``, each
  graph compiled once (compile seconds reported), with the Inductor settings in ``INDUCTOR_SETTINGS`` and
  Inductor's compile-worker pool shut down before each (``shutdown_compile_workers``: why, there).

``evt``, ``cublas`` and ``compile`` of a row are timed in one set of five interleaved rounds (clocks drift; every
ratio then divides times taken under the same clocks); a row torch.compile does not reach (deadline,
``--no-compile``, a failed compile) times ``evt`` and ``cublas`` in rounds of their own. Times are
``triton.testing.do_bench`` medians (L2 flushed before every run); interleaved functions report the median of their
five rounds' medians, after 1.5 s of running them in turn untimed and one discarded round (``Harness.paired``,
``evtorch.runtime.autotune.interleaved_ms``). Also: TFLOP/s (2MNK / time),
achieved bandwidth (fewest bytes: A, B, every tensor input read once, every output written once, over time),
the max error of each contender against the fp32 reference ``fn(A.float() @ B.float(), **inputs)``
(max |out - ref| / max |ref| over outputs), the two floors per row (2MNK / measured matmul rate, bytes / measured
copy bandwidth), and the identity epilogue (plain GEMM) against cuBLAS at 8192^3 ... 1024^3.

Writes ``bench.json`` (updated after every row) and ``bench.png`` under ``--out`` and prints a compact table
last. A deadline (``--deadline-s``) skips what would not fit: torch.compile rows run last.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable as a script or as benchmarks.<name>
from benchmarks.experiment import environ  # noqa: E402
from benchmarks.harness import Harness  # noqa: E402

T0 = time.time()

# Inductor settings for the torch.compile baseline: bound the max-autotune search (the GEMM backends it
# benchmarks) while keeping the mode's behaviour (template autotuning, epilogue-fusion benchmarking,
# coordinate-descent tuning of the pointwise/reduction kernels).
INDUCTOR_SETTINGS = {
    "max_autotune_gemm_backends": "TRITON,ATEN",
    "max_autotune_gemm_search_space": "DEFAULT",
    "autotune_num_choices_displayed": 0,
}

WORKLOAD_ORDER = ("identity", "lincomb_relu", "bias_gelu_aux", "colbcast_leaky", "rowreduce_tanh", "bce_loss",
                  "dgelu_bgrad", "mixed_dag")


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    shapes = []
    for part in text.split(","):
        part = part.strip().lower()
        if not part:
            continue
        dims = [int(x) for x in part.split("x")]
        if len(dims) == 1:
            dims = dims * 3
        if len(dims) != 3 or min(dims) <= 0:
            raise argparse.ArgumentTypeError(f"shape {part!r}: expected MxNxK (or S for S^3)")
        shapes.append(tuple(dims))
    if not shapes:
        raise argparse.ArgumentTypeError("no shapes given")
    return shapes


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="evtorch bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or "bench_out", help="output folder (default $OUT or "
                    "./bench_out)")
    ap.add_argument("--workloads", default=None, help="comma-separated names (default: all, identity first); "
                    "known: " + ", ".join(WORKLOAD_ORDER))
    ap.add_argument("--shapes", type=parse_shapes, default=None,
                    help="MxNxK,... (default 8192x8192x4096,8192x4096x1024)")
    ap.add_argument("--identity-sizes", default=None, help="S,... for the plain-GEMM sweep (default 8192,4096,2048,1024;"
                    " 'none' to skip)")
    ap.add_argument("--quick", action="store_true", help="shorter timing, 2 tuning candidates")
    ap.add_argument("--dry-run", action="store_true", help="CPU only: Triton interpreter, tiny sizes, wall-clock "
                    "timing (checks the script, measures nothing)")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    ap.add_argument("--compile-mode", default="max-autotune-no-cudagraphs")
    ap.add_argument("--candidates", type=int, default=None, help="autotuning candidates per epilogue (default 9; "
                    "--quick 2)")
    ap.add_argument("--diag", action="store_true",
                    help="per row, also time a fixed alternative config (the persistent kernel on 128x128 tiles; "
                    "one more compile per row, 30-50 s in all, so off by default since 2026-11-26)")
    ap.add_argument("--warmup-ms", type=float, default=None)
    ap.add_argument("--rep-ms", type=float, default=None)
    ap.add_argument("--power", type=float, default=0.0, metavar="SECONDS",
                    help="after the rows, run the energy model's baselines (idle, one spinning block, a 1 GiB copy) "
                         "and each row's workload with its picked config (and cuBLAS between them) back to back for "
                         "SECONDS while nvidia-smi samples power and SM clock, then give each row its energy floor "
                         "(benchmarks/power_probe.py, benchmarks/energy_floor.py; default 0: off)")
    ap.add_argument("--intermediates", choices=INTERMEDIATE_MODES, default=None,
                    help="the epilogues' 16-bit intermediates: eager (rounded where eager rounds, evtorch's default) "
                         "or float32 (as torch.compile keeps them); sets EVTORCH_INTERMEDIATES for the run "
                         "(default: as the environment says); the JSON's settings record it")
    ap.add_argument("--deadline-s", type=float, default=560.0, help="stop starting new work after this many seconds "
                    "(the default leaves the last started item room within a 600 s device call: a torch.compile row "
                    "starts only with 40 s left; the longest measured took 56 s, 22 s since the compile-worker pool is "
                    "shut down before each row; every row fit in 454-510 s on an H100 before the tuner's 1.5 s "
                    "warm-up, which adds about 25 s)")
    return ap


# ---------------------------------------------------------------------------------------------------- helpers
class Bench(Harness):
    """Everything one run needs: args, device, timers, results and the log."""

    def __init__(self, args):
        quick = args.quick
        super().__init__(args, "bench", {"env": {}, "settings": {}, "ceilings": {}, "shapes": [], "rows": [],
                                         "identity": [], "notes": []},
                         cuda=not args.dry_run, t0=T0,
                         warmup_ms=args.warmup_ms if args.warmup_ms is not None else (10.0 if quick else 25.0),
                         rep_ms=args.rep_ms if args.rep_ms is not None else (50.0 if quick else 250.0))
        self.dev = "cuda" if self.cuda else "cpu"

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def host_us(self, fn, n: int = 20) -> float:
        """Host microseconds per call while the GPU is busy (calls return before their kernels finish)."""
        fn()
        self.sync()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        host = (time.perf_counter() - t) / n * 1e6
        self.sync()
        return host


def _as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def max_error(out, ref) -> float:
    """max over outputs of max|out - ref| / max|ref| (inf when an output has NaN where ref has none)."""
    import torch

    worst = 0.0
    for o, r in zip(_as_tuple(out), _as_tuple(ref)):
        if o is None or r is None:
            continue
        o = o.detach().float()
        r = r.detach().float()
        if tuple(o.shape) != tuple(r.shape):
            return math.inf
        bad = torch.isnan(o) & ~torch.isnan(r)
        if bool(bad.any()):
            return math.inf
        diff = (o - r).abs().nan_to_num(0.0).max().item() if o.numel() else 0.0
        scale = r.abs().nan_to_num(0.0).max().item() if r.numel() else 1.0
        worst = max(worst, diff / (scale if scale > 0 else 1.0))
    return worst


def kernel_resources(module) -> list[dict]:
    """Registers / spills / shared memory of every compiled kernel of a generated module (Triton caches)."""
    rows = []
    for name in dir(module):
        fn = getattr(module, name)
        caches = getattr(fn, "device_caches", None)
        if not caches:
            continue
        try:
            for cache in caches.values():
                for k in cache[0].values():
                    md = getattr(k, "metadata", None)
                    rows.append({"kernel": name, "n_regs": getattr(k, "n_regs", None),
                                 "n_spills": getattr(k, "n_spills", None), "shared": getattr(md, "shared", None),
                                 "num_warps": getattr(md, "num_warps", None),
                                 "num_stages": getattr(md, "num_stages", None)})
        except Exception as exc:  # noqa: BLE001
            rows.append({"kernel": name, "error": f"{type(exc).__name__}: {exc}"[:200]})
    return rows


def _nvidia_smi() -> dict:
    try:
        q = "name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu"
        text = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=20).stdout.strip()
        return dict(zip(q.split(","), [x.strip() for x in text.split(",")]))
    except Exception as exc:  # noqa: BLE001
        return {"error": str(exc)[:200]}


# ---------------------------------------------------------------------------------------------------- phases
def environment(b: Bench):
    import torch
    import triton

    env = {"torch": torch.__version__, "triton": triton.__version__, "python": sys.version.split()[0],
           "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
           "dry_run": b.args.dry_run, "argv": sys.argv[1:]}
    if b.cuda:
        p = torch.cuda.get_device_properties(0)
        env.update({"device": p.name, "sms": p.multi_processor_count, "capability": f"{p.major}.{p.minor}",
                    "memory_gib": round(p.total_memory / 2 ** 30, 1), "cuda": torch.version.cuda,
                    "nvidia_smi": _nvidia_smi()})
    else:
        env.update({"device": "cpu (Triton interpreter)"})
    b.results["env"] = env
    b.log("ENV", json.dumps(env))


def ceilings(b: Bench):
    """Measured copy bandwidth (bytes read + written) and bf16 matmul rate on random data."""
    torch = b.torch
    n = (1 << 29) if b.cuda else (1 << 16)  # 1 GiB of bf16
    x = torch.randn(n, device=b.dev, dtype=torch.float32).to(torch.bfloat16)
    y = torch.empty_like(x)
    ms = b.timer(lambda: y.copy_(x))
    copy_bw = 2 * x.numel() * x.element_size() / (ms * 1e-3)
    del x, y
    s = 8192 if b.cuda else 64
    from evtorch.examples import operands

    A, B = operands(s, s, s, b.dev, torch.bfloat16)
    ms_mm = b.timer(lambda: torch.matmul(A, B))
    rate = 2 * s ** 3 / (ms_mm * 1e-3)
    b.results["ceilings"] = {"copy_GBps": copy_bw / 1e9, "copy_ms_1GiB": ms, "matmul_tflops": rate / 1e12,
                             "matmul_size": s}
    b.log(f"CEILINGS copy {copy_bw / 1e9:.0f} GB/s, bf16 matmul {s}^3 {rate / 1e12:.0f} TFLOP/s")


@contextlib.contextmanager
def _recording_config():
    """``seen["config"]``: the config of the calls inside the ``with`` block that prepare a launch (evtorch's
    ``runtime.gemm.FIRST_CALL_HOOKS``; the bench's poisoned call is one: the poison knob is part of the launch key).
    Until 2026-11-21 the bench wrapped ``runtime.gemm._execute`` for the whole run instead, which sent every timed
    call through the first-call path (40-180 us per call too slow)."""
    from evtorch.runtime import gemm as rg

    seen = {"config": None, "config_dict": None}

    def hook(cfg):
        seen["config"], seen["config_dict"] = cfg.short(), cfg.to_dict()

    rg.FIRST_CALL_HOOKS.append(hook)
    try:
        yield seen
    finally:
        rg.FIRST_CALL_HOOKS.remove(hook)


def _tuning_files(b: Bench) -> dict:
    from evtorch.runtime import knobs

    d = knobs.cache_dir() / "autotune"
    out = {}
    if d.is_dir():
        for f in d.glob("*.json"):
            try:
                out[f.name] = json.loads(f.read_text())
            except Exception:  # noqa: BLE001
                pass
    return out


def evt_rows(b: Bench, shapes, names):
    """Phase 1: evtorch, cuBLAS and eager for every (shape, workload)."""
    import evtorch as evt
    from evtorch.api import get_epilogue
    from evtorch.cli import format_phases
    from evtorch.codegen.configs import GemmConfig
    from evtorch.codegen.program import build_program
    from evtorch.runtime.gemm import fast_math_mode
    from evtorch.examples import eager_reference, operands
    from benchmarks.workloads import bench_workload, tensor_bytes

    torch = b.torch
    ceil = b.results["ceilings"]
    diag_cfgs = [GemmConfig("persistent_tma", 128, 128, 64, 8, 1, 8, 4)] if (b.args.diag and b.cuda) else []
    for (M, N, K) in shapes:
        if b.time_left() < 60:
            b.log("SKIP shape", (M, N, K), "deadline")
            continue
        torch.manual_seed(0)
        A, B = operands(M, N, K, b.dev, torch.bfloat16)
        flops = 2.0 * M * N * K
        ms_cublas = b.timer(lambda: torch.matmul(A, B))
        shape_rec = {"shape": [M, N, K], "flops": flops, "cublas_ms": [ms_cublas],
                     "cublas_tflops": flops / ms_cublas / 1e9,
                     "floor_compute_ms": flops / (ceil["matmul_tflops"] * 1e12) * 1e3}
        b.results["shapes"].append(shape_rec)
        b.log(f"SHAPE {M}x{N}x{K}: cuBLAS {ms_cublas:.4f} ms ({flops / ms_cublas / 1e9:.0f} TFLOP/s)")
        for name in names:
            if b.time_left() < 45:
                b.log("SKIP", name, (M, N, K), "deadline")
                continue
            fn, mk = bench_workload(name)
            row = {"workload": name, "shape": [M, N, K]}
            b.results["rows"].append(row)
            try:
                inputs = mk(M, N, b.dev, torch.bfloat16)
                kw = dict(backend="triton") if not b.cuda else {}
                before = set(_tuning_files(b))
                t = time.time()
                evt.gemm(A, B, fn, **kw, **inputs)
                b.sync()
                row["evt_first_call_s"] = round(time.time() - t, 2)
                after = _tuning_files(b)
                tuned = [v for f, v in after.items() if f not in before]
                row["tuning_ms"] = [v.get("timings_ms") for v in tuned]
                row["tuning_samples_ms"] = [{"order": v.get("order"), "samples": v.get("samples_ms"),
                                             "final": v.get("final_ms")} for v in tuned]
                row["tuning_phases_s"] = [v.get("phases_s") for v in tuned]
                with environ("EVTORCH_POISON", "1"), _recording_config() as seen:
                    out = evt.gemm(A, B, fn, **kw, **inputs)
                row["config"], row["config_dict"] = seen["config"], seen["config_dict"]
                ref = eager_reference(fn, A, B, **inputs)
                row["err_evt"] = max_error(out, ref)
                row["bytes"] = tensor_bytes(A, B, inputs) + tensor_bytes(out)
                row["floor_memory_ms"] = row["bytes"] / (ceil["copy_GBps"] * 1e9) * 1e3
                row["floor_ms"] = max(row["floor_memory_ms"], shape_rec["floor_compute_ms"])
                del out
                # evt and cuBLAS are timed later, in one set of rounds with torch.compile (compile_rows; rows it
                # does not reach: pair_rows)
                row["evt_kernel_ms"] = b.graph_timer(lambda: evt.gemm(A, B, fn, **kw, **inputs))
                row["evt_host_us"] = b.host_us(lambda: evt.gemm(A, B, fn, **kw, **inputs))

                def eager():
                    return fn(A @ B, **inputs)

                out_e = eager()
                row["err_eager"] = max_error(out_e, ref)
                del out_e, ref
                row["eager_ms"] = b.timer(eager)
                if diag_cfgs:
                    row["diag"] = {}
                    for cfg in diag_cfgs:
                        try:
                            row["diag"][cfg.short()] = b.graph_timer(
                                lambda: evt.gemm(A, B, fn, config=cfg, **inputs))
                        except Exception as exc:  # noqa: BLE001
                            row["diag"][cfg.short()] = f"{type(exc).__name__}: {str(exc)[:200]}"
                if b.cuda:
                    try:
                        ep = get_epilogue(fn, (M, N), torch.float32, inputs)
                        row["kernels"] = kernel_resources(build_program(ep, out_dtype=A.dtype,
                                                                         fast_math=fast_math_mode(A)).module)
                    except Exception as exc:  # noqa: BLE001
                        row["kernels"] = [{"error": f"{type(exc).__name__}: {exc}"[:200]}]
                derive(row, shape_rec)
                b.log(f"  {name:15s} evt kernel {_f(row['evt_kernel_ms'])} ms (host {row['evt_host_us']:.0f} us) "
                      f"| eager {row['eager_ms']:.4f} | err {row['err_evt']:.2e} | {row['config']} | first call "
                      f"{row['evt_first_call_s']} s" + "".join(f" ({format_phases(p)})"
                                                                for p in row["tuning_phases_s"] if p))
            except Exception as exc:  # noqa: BLE001
                row["error"] = f"{type(exc).__name__}: {exc}"[:2000]
                b.log("  FAIL", name, traceback.format_exc()[-3000:])
                os.environ.pop("EVTORCH_POISON", None)
            b.save()
        # cuBLAS again, after the rows: its spread says what differences are noise
        shape_rec["cublas_ms"].append(b.timer(lambda: torch.matmul(A, B)))
        b.save()
        del A, B


def _by_shape(b: Bench, want):
    """The rows of phase 1 that passed it and that ``want(row)`` selects, by shape: (shape, its shape record,
    fresh operands A and B of the shape (seed 0), the rows), for each shape that has such rows."""
    import torch

    from evtorch.examples import operands

    by_shape = {}
    for row in b.results["rows"]:
        if "error" not in row and "err_evt" in row and want(row):
            by_shape.setdefault(tuple(row["shape"]), []).append(row)
    for shape, rows in by_shape.items():
        M, N, K = shape
        torch.manual_seed(0)
        A, B = operands(M, N, K, b.dev, torch.bfloat16)
        shape_rec = next(s for s in b.results["shapes"] if tuple(s["shape"]) == shape)
        yield shape, shape_rec, A, B, rows
        del A, B


def _rows_in_time(b: Bench, want, *, left_s: float, skip, last=None):
    """The rows ``_by_shape(b, want)`` gives, each as (row, shape, its shape record, A, B, epilogue function,
    make_inputs), while ``left_s`` seconds are left before the deadline; a row past it goes to ``skip(row,
    shape)`` instead. ``last(row)``: rows for which it is true come last in their shape. The results are saved
    after each row the caller has handled."""
    from benchmarks.workloads import bench_workload

    for shape, shape_rec, A, B, rows in _by_shape(b, want):
        for row in sorted(rows, key=last) if last is not None else rows:
            if b.time_left() < left_s:
                skip(row, shape)
                continue
            fn, mk = bench_workload(row["workload"])
            yield row, shape, shape_rec, A, B, fn, mk
            b.save()


def _time_row(b: Bench, row: dict, shape_rec: dict, A, B, fn, inputs: dict, **others) -> None:
    """evtorch's public call and cuBLAS, and ``others`` (name -> callable, e.g. ``compile``), in one set of
    interleaved rounds (``Harness.paired``): each one's median and rounds into ``row`` (``<name>_ms``,
    ``<name>_ms_rounds``), then the row's ratios (``derive``)."""
    import torch

    import evtorch as evt

    kw = dict(backend="triton") if not b.cuda else {}
    t = b.paired({"cublas": lambda: torch.matmul(A, B), "evt": lambda: evt.gemm(A, B, fn, **kw, **inputs),
                  **others})
    for name, (ms, rounds) in t.items():
        row[f"{name}_ms"], row[f"{name}_ms_rounds"] = ms, rounds
    derive(row, shape_rec)


def compile_baseline(fn, name: str, mode: str):
    """The torch.compile baseline of a row: ``fn(A @ B, **kw)`` under ``torch.compile(mode=mode, dynamic=False)``,
    as a fresh code object (``base_<name>``) per call, since Dynamo caches per code object: each row compiles anew
    (nothing compiled until its first call)."""
    import torch

    ns = {"fn": fn}
    exec(f"def base_{name}(A, B, **kw):\n    return fn(A @ B, **kw)\n", ns)
    return torch.compile(ns[f"base_{name}"], mode=mode, dynamic=False)


# the on-disk caches a first call reads, each set to a directory of this process unless the caller set it
COMPILE_CACHES = ("EVTORCH_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


def fresh_compile_caches() -> dict[str, str]:
    """Point evtorch's tuning cache, Inductor's caches and Triton's kernel cache at empty directories of this
    process (a variable the caller set is kept: it names a cache on purpose), and return where each points.

    Why: every run should measure what a user's first call costs, evtorch's tuning and torch.compile's
    max-autotune alike. With the machine's default directories, a second bench on the same machine loaded
    Inductor's results from the first (H200, 2026-11-27 12:48 UTC: torch.compile's 16 compiles took 9.7 s against
    133.5 s a run earlier, and the cached bias_gelu_aux graph at 8192x4096x1024 ran 0.197-0.216 ms in three of
    its five rounds against 0.148-0.159 ms), while evtorch re-tuned from nothing: the two columns measured
    different things."""
    root = f"/tmp/evtorch_bench_{os.getpid()}"
    for var in COMPILE_CACHES:
        os.environ.setdefault(var, root if var == "EVTORCH_CACHE_DIR" else f"{root}_{var.split('_')[0].lower()}")
    return {var: os.environ[var] for var in COMPILE_CACHES}


def shutdown_compile_workers() -> None:
    """Shut Inductor's compile-worker pool down before a torch.compile row's compile (the next compile starts it
    again). Why: in one process, the heavy compiles after the first one or two took 40-50 s where the first took
    about 20 s, and with the pool shut down first the same compile took 10.4 s (H100, 2026-11-27: lincomb_relu at
    8192x4096x1024 after three graphs at 8192x8192x4096, ``benchmarks/compile_profile.py --pool``; a pool woken up
    and ready: 39.9 s). The compiled code is Inductor's either way; only where its kernels are compiled changes.
    docs/benchmarks-log.md, "torch.compile's compiles in one process"."""
    from torch._inductor import async_compile

    if hasattr(async_compile, "shutdown_compile_workers"):
        async_compile.shutdown_compile_workers()


def compile_rows(b: Bench):
    """Phase 2: torch.compile each (workload, shape) once, then time it in interleaved rounds with cuBLAS and
    evtorch (whose config phase 1 tuned): every ratio of the row comes from these rounds (cuBLAS's clocks drift
    over a run, H200: 0.80 -> 0.76 ms at 8192^2x4096 within a minute). Fresh inputs of the phase-1 rows' shapes.
    Until 2026-11-27 phase 1 timed evtorch and cuBLAS in rounds of their own as well; timing each row once saves
    ~2.5 s a row, what the bench needed to fit its device call again after its rounds were settled for 1.5 s."""
    import torch

    from evtorch.examples import eager_reference

    applied = {}
    import torch._inductor.config as icfg

    for k, v in INDUCTOR_SETTINGS.items():
        if hasattr(icfg, k):
            setattr(icfg, k, v)
            applied[k] = v
    for k in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, k):
            setattr(torch._dynamo.config, k, 256)
    b.results["settings"]["inductor"] = applied
    b.results["settings"]["compile_mode"] = b.args.compile_mode
    b.log("COMPILE settings", json.dumps(applied), "mode", b.args.compile_mode)

    def skip(row, shape):
        row["compile_skipped"] = "deadline"
        b.log("SKIP compile", row["workload"], shape, "deadline")

    # the fused workloads first: the identity's torch.compile row (cuBLAS either way) matters least when the
    # deadline cuts the phase short
    for row, (M, N, K), shape_rec, A, B, fn, mk in _rows_in_time(b, lambda row: True, left_s=40, skip=skip,
                                                                 last=lambda r: r["workload"] == "identity"):
        name = row["workload"]
        try:
            inputs = mk(M, N, b.dev, torch.bfloat16)
            cfn = compile_baseline(fn, name, b.args.compile_mode)
            shutdown_compile_workers()
            t = time.time()
            out_c = cfn(A, B, **inputs)
            b.sync()
            row["compile_s"] = round(time.time() - t, 1)
            ref = eager_reference(fn, A, B, **inputs)
            row["err_compile"] = max_error(out_c, ref)
            del out_c, ref
            _time_row(b, row, shape_rec, A, B, fn, inputs, compile=lambda: cfn(A, B, **inputs))
            b.log(f"  {name:15s} evt {row['evt_ms']:.4f} ms x{row['evt_vs_cublas']:.3f} cuBLAS | compile "
                  f"{row['compile_ms']:.4f} ms x{row['compile_vs_cublas']:.3f} (compiled in {row['compile_s']} s, "
                  f"err {row['err_compile']:.2e}) | evt / compile {row['evt_vs_compile']:.3f}")
        except Exception as exc:  # noqa: BLE001
            row["compile_error"] = f"{type(exc).__name__}: {exc}"[:2000]
            b.log("  COMPILE FAIL", name, traceback.format_exc()[-2000:])


def pair_rows(b: Bench):
    """Phase 3: evtorch and cuBLAS in interleaved rounds for the rows phase 2 did not time (torch.compile skipped
    by --no-compile or the deadline, or failed): a row's evtorch time is worth more than the deadline's margin,
    so this runs while 5 s are left (phase 2 stops with 40 s left)."""
    import torch

    def skip(row, shape):
        b.log("SKIP evt timing", row["workload"], shape, "deadline")

    for row, (M, N, K), shape_rec, A, B, fn, mk in _rows_in_time(b, lambda row: "evt_ms" not in row, left_s=5,
                                                                 skip=skip):
        name = row["workload"]
        try:
            inputs = mk(M, N, b.dev, torch.bfloat16)
            _time_row(b, row, shape_rec, A, B, fn, inputs)
            b.log(f"  {name:15s} {M}x{N}x{K} evt {row['evt_ms']:.4f} ms x{row['evt_vs_cublas']:.3f} cuBLAS")
        except Exception as exc:  # noqa: BLE001
            row["error"] = f"{type(exc).__name__}: {exc}"[:2000]
            b.log("  FAIL", name, traceback.format_exc()[-3000:])


def identity_sweep(b: Bench, sizes):
    import evtorch as evt
    from evtorch.examples import operands

    torch = b.torch
    for s in sizes:
        if b.time_left() < 30:
            b.log("SKIP identity", s, "deadline")
            continue
        A, B = operands(s, s, s, b.dev, torch.bfloat16)
        kw = dict(backend="triton") if not b.cuda else {}
        evt.gemm(A, B, **kw)
        flops = 2.0 * s ** 3
        rec = {"size": s}
        t = b.paired({"cublas": lambda: torch.matmul(A, B), "evt": lambda: evt.gemm(A, B, **kw)})
        (rec["cublas_ms"], rec["cublas_ms_rounds"]), (rec["evt_ms"], rec["evt_ms_rounds"]) = t["cublas"], t["evt"]
        rec["evt_kernel_ms"] = b.graph_timer(lambda: evt.gemm(A, B, **kw))
        rec["cublas_tflops"] = flops / rec["cublas_ms"] / 1e9
        rec["evt_tflops"] = flops / rec["evt_ms"] / 1e9
        rec["evt_pct_of_cublas"] = 100.0 * rec["cublas_ms"] / rec["evt_ms"]
        if rec["evt_kernel_ms"]:
            rec["evt_kernel_pct_of_cublas"] = 100.0 * rec["cublas_ms"] / rec["evt_kernel_ms"]
        b.results["identity"].append(rec)
        b.log(f"IDENTITY {s}^3: cuBLAS {rec['cublas_tflops']:.0f} TFLOP/s, evt {rec['evt_tflops']:.0f} "
              f"({rec['evt_pct_of_cublas']:.1f}%), evt kernel {_f(rec['evt_kernel_ms'])} ms")
        b.save()
        del A, B


def derive(row: dict, shape_rec: dict):
    """Ratios, TFLOP/s and bandwidth from the times a row has."""
    flops = shape_rec["flops"]
    for who in ("evt", "evt_kernel", "eager", "compile"):
        ms = row.get(f"{who}_ms")
        if not ms:
            continue
        cub = row.get("cublas_ms") or shape_rec["cublas_ms"][0]
        row[f"{who}_vs_cublas"] = ms / cub
        row[f"{who}_tflops"] = flops / ms / 1e9
        if row.get("bytes"):
            row[f"{who}_GBps"] = row["bytes"] / ms / 1e6
    if row.get("compile_ms") and row.get("evt_ms"):
        row["evt_vs_compile"] = row["evt_ms"] / row["compile_ms"]
    if row.get("evt_ms") and row.get("floor_ms"):
        row["evt_vs_floor"] = row["evt_ms"] / row["floor_ms"]


def _f(x, fmt="{:.4f}"):
    return "-" if x is None else fmt.format(x)


def chart(b: Bench):
    from benchmarks.plot import chart as draw

    msg = draw(b.results, b.out / "bench.png")
    if msg:
        b.log(msg)


def table(b: Bench):
    r = b.results
    c = r["ceilings"]
    lines = [f"\n== evtorch bench: {r['env'].get('device')} | torch {r['env'].get('torch')} | triton "
             f"{r['env'].get('triton')} | {r['env'].get('date_utc')} | copy {c.get('copy_GBps', 0):.0f} GB/s | "
             f"matmul {c.get('matmul_tflops', 0):.0f} TFLOP/s"
             + (f" | intermediates {r['settings']['intermediates']}"
                if r.get("settings", {}).get("intermediates", "eager") != "eager" else "")]
    energy = any("energy_floor" in row for row in r["rows"])  # --power: each row's energy floor after evt/cub
    for s in r["shapes"]:
        M, N, K = s["shape"]
        lines.append(f"-- {M}x{N}x{K}: cuBLAS {', '.join(f'{x:.4f}' for x in s['cublas_ms'])} ms "
                     f"({s['cublas_tflops']:.0f} TFLOP/s); compute floor {s['floor_compute_ms']:.4f} ms")
        lines.append(f"{'workload':15s} {'cub ms':>7s} {'evt ms':>8s} {'kern ms':>8s} {'host us':>7s} {'evt/cub':>7s} "
                     + (f"{'e.floor':>7s} " if energy else "") + f"{'kern/cub':>8s} "
                     f"{'cmp/cub':>7s} {'eag/cub':>7s} {'evt/cmp':>7s} {'TFLOP/s':>7s} {'GB/s':>6s} {'floor':>7s} "
                     f"{'err evt':>8s} {'err cmp':>8s}  config")
        for row in r["rows"]:
            if row["shape"] != s["shape"]:
                continue
            if "evt_ms" not in row:
                lines.append(f"{row['workload']:15s} FAILED {row.get('error', '')[:100]}")
                continue
            lines.append(
                f"{row['workload']:15s} {_f(row.get('cublas_ms')):>7s} {row['evt_ms']:8.4f} {_f(row.get('evt_kernel_ms')):>8s} "
                f"{row.get('evt_host_us', 0):7.0f} {row['evt_vs_cublas']:7.3f} "
                + (f"{_f(row.get('energy_floor'), '{:.3f}'):>7s} " if energy else "")
                + f"{_f(row.get('evt_kernel_vs_cublas'), '{:.3f}'):>8s} "
                f"{_f(row.get('compile_vs_cublas'), '{:.3f}'):>7s} {_f(row.get('eager_vs_cublas'), '{:.3f}'):>7s} "
                f"{_f(row.get('evt_vs_compile'), '{:.3f}'):>7s} {row['evt_tflops']:7.0f} {row.get('evt_GBps', 0):6.0f} "
                f"{row.get('floor_ms', 0):7.4f} {row.get('err_evt', 0):8.1e} {_f(row.get('err_compile'), '{:.1e}'):>8s}  "
                f"{(row.get('config') or '').replace('persistent_tma_', 'tma_')}")
    if r["identity"]:
        lines.append("-- identity epilogue vs cuBLAS: " + "; ".join(
            f"{x['size']}^3 {x['evt_tflops']:.0f}/{x['cublas_tflops']:.0f} TFLOP/s = {x['evt_pct_of_cublas']:.1f}% "
            f"(kernel {_f(x.get('evt_kernel_pct_of_cublas'), '{:.1f}')}%)" for x in r["identity"]))
    b.log("\n".join(lines))


# ---------------------------------------------------------------------------------------------------- main
SUITES = {"training": "benchmarks.training_bench", "scan": "benchmarks.scan_bench"}


def power_rows(b: Bench, seconds: float) -> None:
    """``--power``: the energy model's baselines (the board idle, one spinning block, a 1 GiB copy), then every
    row's workload with the config picked for it, and cuBLAS before, between and after, run back to back while
    nvidia-smi samples power, SM clock and clock-event reasons (``benchmarks.power_probe``); ``results["power"]``.
    Each job costs about ``seconds`` + 1 s; jobs that would pass the deadline are skipped. Then each row that was
    probed gets its ``energy_floor`` (``benchmarks.energy_floor``: the lowest evt / cuBLAS the board's power cap
    allows for its bytes) and ``beyond_bytes_mj``."""
    from benchmarks.power_probe import LIMITS_KEY, bench_jobs, board_limits, measure, with_baselines

    rows = b.results.setdefault("power", [])
    for shape, jobs in with_baselines(bench_jobs(b.results)).items():
        M, N, K = (int(x) for x in shape.split("x"))
        for job, config in jobs:
            if b.time_left() < seconds + 5:
                b.log(f"SKIP power {job} {shape} deadline")
                continue
            try:
                r = measure(job, M, N, K, seconds, config)
            except Exception as exc:  # noqa: BLE001 - e.g. no nvidia-smi: the rows' timings stand
                b.log(f"power {job} {shape}: {type(exc).__name__}: {exc}"[:300])
                return
            rows.append(r)
            per = f"{r['ms_per_launch'] * 1e3:8.1f}" if r.get("ms_per_launch") is not None else "       -"
            b.log(f"  power {job:15s} {shape} {per} us/launch {r['power_w']:6.1f} W "
                  f"SM {r['sm_mhz']:5.0f} MHz  reasons {','.join(r.get('reasons') or []) or '-'}")
        b.save()
    try:
        limits = board_limits()
    except OSError as exc:
        b.log(f"energy floor: not computed (nvidia-smi: {exc})")
        return
    add_energy_floors(b, {LIMITS_KEY: limits, "rows": rows})


def add_energy_floors(b: Bench, power: dict) -> None:
    """Each bench row the power probe ran gets ``energy_floor`` and ``beyond_bytes_mj`` (``benchmarks.energy_floor``);
    the model's constants go to ``results["energy_model"]``. Without the baselines (cut by the deadline) the rows
    stay as they are and the log says why."""
    from benchmarks.energy_floor import attach_floors, floors

    try:
        model, found = floors(b.results, power)
    except (ValueError, KeyError, TypeError) as exc:
        b.log(f"energy floor: not computed ({exc})")
        return
    b.results["energy_model"] = model
    attach_floors(b.results.get("rows", []), found)
    b.log(f"energy floor: {model['e_byte_pj']:.0f} pJ per byte moved, static {model['static_w']:.0f} W; "
          + ", ".join(f"{f['workload']} {'x'.join(map(str, f['shape']))} {f['floor_ratio']:.3f}" for f in found))
    b.save()


#: evtorch.runtime.knobs.INTERMEDIATE_MODES, spelled here so the parser needs no evtorch import (a test keeps them equal)
INTERMEDIATE_MODES = ("eager", "float32")


def apply_intermediates(args) -> None:
    """``--intermediates``: set EVTORCH_INTERMEDIATES for this process (read when each epilogue is traced)."""
    if args.intermediates is not None:
        os.environ["EVTORCH_INTERMEDIATES"] = args.intermediates


def main(argv=None) -> int:
    """``evtorch bench [ARGS]``: the fused-GEMM workloads; ``evtorch bench training|scan [ARGS]``: the
    forward+backward (issue 6) and scan (issue 5) benchmarks, each with its own ``--help``."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in SUITES:
        import importlib
        saved, sys.argv[0] = sys.argv[0], f"evtorch bench {argv[0]}"  # argparse's prog in the suite's usage lines
        try:
            return importlib.import_module(SUITES[argv[0]]).main(argv[1:]) or 0
        finally:
            sys.argv[0] = saved
    args = build_parser().parse_args(argv)
    if args.dry_run and os.environ.get("TRITON_INTERPRET") != "1":
        # Triton picks interpreter or compiler when a @triton.jit function is created: start afresh with it set
        env = dict(os.environ, TRITON_INTERPRET="1")
        root = str(Path(__file__).resolve().parents[1])
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
        argv = sys.argv[1:] if argv is None else list(argv)
        return subprocess.call([sys.executable, "-m", "benchmarks.run", *argv], env=env, cwd=root)
    if args.candidates is None:
        args.candidates = 2 if args.quick else 9
    apply_intermediates(args)
    os.environ["EVTORCH_AUTOTUNE"] = "1"
    caches = fresh_compile_caches()
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print("evtorch bench: no CUDA device here (use --dry-run to check the script on CPU)", file=sys.stderr)
        return 2
    from benchmarks.workloads import IDENTITY_SIZES, SHAPES, WORKLOADS

    names = list(WORKLOAD_ORDER) if args.workloads is None else [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = [n for n in names if n != "identity" and n not in WORKLOADS]
    if unknown:
        print(f"evtorch bench: unknown workloads {unknown}; known: {', '.join(WORKLOAD_ORDER)}", file=sys.stderr)
        return 2
    shapes = args.shapes or (list(SHAPES) if not args.dry_run else [(64, 64, 32), (64, 32, 32)])
    if args.identity_sizes is None:
        sizes = list(IDENTITY_SIZES) if not args.dry_run else [64, 32]
    elif args.identity_sizes.strip().lower() in ("", "none"):
        sizes = []
    else:
        sizes = [int(x) for x in args.identity_sizes.split(",")]

    from evtorch.runtime import gemm as rg
    from evtorch.runtime import knobs

    rg.MAX_TUNE_CANDIDATES = args.candidates
    b = Bench(args)
    b.results["settings"].update({"candidates": args.candidates, "warmup_ms": b.warmup, "rep_ms": b.rep,
                                  "shapes": shapes, "workloads": names, "identity_sizes": sizes,
                                  "evtorch_cache_dir": os.environ["EVTORCH_CACHE_DIR"], "caches": caches,
                                  # the epilogue numerics measured (EVTORCH_INTERMEDIATES=float32: as torch.compile)
                                  "intermediates": knobs.intermediates_mode(),
                                  "fast_math": knobs.fast_math_mode()})
    environment(b)
    ceilings(b)
    b.save()
    evt_rows(b, shapes, names)
    identity_sweep(b, sizes)
    if not args.no_compile:
        compile_rows(b)
    pair_rows(b)
    if args.power > 0 and not args.dry_run:
        power_rows(b, args.power)
    b.results["total_s"] = round(time.time() - T0, 1)
    b.save()
    chart(b)
    table(b)
    b.log(f"total {time.time() - T0:.0f} s; results in {b.out}/bench.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Fast-math path on the GPU (issue 4): correctness and speed of the tanh / sigmoid hardware approximations
(``codegen/fastmath.py``), everything in one device call:

    PYTHONUNBUFFERED=1 python -m benchmarks.fastmath_check --out $OUT [--deadline-s 310] [--workers 14]

0. The approximations alone (main process, while the workers compile): ``tlmath.tanh`` / ``tanh_approx`` /
   ``sigmoid`` / ``sigmoid_approx`` / ``logsigmoid`` / ``logsigmoid_approx`` and the ``0.5 * tanh_approx(x / 2) + 0.5`` form on 8M points against float64
   torch (max relative / absolute error, mean signed relative error = bias; sigmoid: relative error for x < -2),
   and tanh-GELU rounded to bf16 with each tanh against the float64 GELU rounded to bf16 (bf16 ulps).
1. Compile + check, in parallel processes sharing the Triton and evtorch caches on disk (the timing process then
   only loads binaries): the benchmark workloads under ``EVTORCH_FAST_MATH`` = never / auto / always (modes that
   give the same program are run once) on the forced 128x256 config at both shapes with outputs poisoned (max
   error over the fp32 reference, as ``evtorch bench``, and relative Frobenius error per output), plus every
   autotuning candidate compiled once (warm cache); ``evtorch.testing``'s cases that contain a tanh or sigmoid
   (found by tracing: the ``always`` mode approximates something), fp16 and bf16, every mode, and the examples
   with tanh / sigmoid on every template (as ``evtorch.selftest``), with ``evtorch.testing.check`` (fresh inputs,
   poisoned outputs, float64 reference, the selftest's tolerances); ``tests/test_fast_math.py -m gpu``.
2. Timing, one process: per shape and workload, cuBLAS right before the row, then the forced config in each mode,
   interleaved twice (never, auto, never, auto: the repeat is the noise), CUDA-graph replay (do_bench median, L2
   flushed) as ``benchmarks/pingpong_check.py``; then the tuned default (``EVTORCH_AUTOTUNE=1``, 5 candidates, a
   fresh tuning cache) per mode.

Writes fastmath.json, fastmath_log.txt, workers_log.txt under --out; prints a table last. ``--dry-run`` runs a tiny
version through the Triton interpreter on CPU (checks the script only: every mode is then 'never').
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.pingpong_check import SHAPES, WORKLOADS, kernel_rows, max_error, workload  # noqa: E402
from benchmarks.experiment import (ROOT, finish_workers, parser, poisoned, start_workers, tuned_config,  # noqa: E402
                                  worker_env, worker_share, workload_rows)

T0 = time.time()
MODES = ("never", "auto", "always")


def base_config():
    from evtorch.codegen.configs import GemmConfig

    return GemmConfig("persistent_tma", 128, 256, 64, 8, 1, 8, 3, (("EPILOGUE_SUBTILE", True),))


def tune_candidates(M, N, K):
    import torch

    from evtorch.codegen.policy import candidate_configs

    return candidate_configs(M, N, K, torch.bfloat16, "cuda", tma_ok=True)[:5]


def distinct_modes(fn, mk, out_dtype=None) -> list:
    """The modes that give different programs for this epilogue (bf16 operands and outputs), first of each."""
    import torch

    from evtorch.api import get_epilogue
    from evtorch.codegen.fastmath import plan

    out_dtype = out_dtype or torch.bfloat16
    ep = get_epilogue(fn, (64, 64), torch.float32, mk(64, 64, "cpu", torch.bfloat16))
    seen, modes = set(), []
    for m in MODES:
        f = plan(ep, out_dtype, m)[1]
        if f not in seen:
            seen.add(f)
            modes.append(m)
    return modes


def affected_cases():
    """evtorch.testing cases with an op that has a fast emission (traced: 'always' approximates something)."""
    import torch

    from evtorch.api import get_epilogue
    from evtorch.codegen.fastmath import select_for
    from evtorch.testing import all_cases

    out = []
    for case in all_cases():
        M, N, L = 16, 16, 3
        try:
            inputs = case.make_inputs(M, N, L, "cpu", torch.bfloat16)
            ep = get_epilogue(case.fn, (L, M, N) if case.batched else (M, N), torch.float32, inputs)
            if select_for(ep, torch.bfloat16, "always"):
                out.append(case)
        except Exception:  # noqa: BLE001 - a case that does not trace here is not ours to check
            continue
    return out


# ------------------------------------------------------------------------------------------------ phase 0
def approximations(dry: bool) -> dict:
    """Errors of the approximations alone (float64 torch reference)."""
    import torch
    import triton
    import triton.language as tl

    from evtorch.codegen import tlmath

    @triton.jit
    def _apply(x_ptr, y_ptr, n, WHICH: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
        if WHICH == 0:
            y = tlmath.tanh(x)
        elif WHICH == 1:
            y = tlmath.tanh_approx(x)
        elif WHICH == 2:
            y = tlmath.sigmoid(x)
        elif WHICH == 3:
            y = tlmath.sigmoid_approx(x)
        elif WHICH == 4:
            y = 0.5 * tlmath.tanh_approx(0.5 * x) + 0.5
        elif WHICH == 5:
            y = tlmath.logsigmoid(x)
        elif WHICH == 6:
            y = tlmath.logsigmoid_approx(x)
        else:
            y = tlmath.tanh_gpu(x)
        tl.store(y_ptr + offs, y, mask=offs < n)

    dev = "cuda"
    n = 1 << (12 if dry else 22)
    g = torch.Generator(device="cpu").manual_seed(7)
    x = torch.cat([torch.linspace(-30, 30, n), torch.randn(n, generator=g) * 3]).to(dev)
    names = ["tanh", "tanh_approx", "sigmoid", "sigmoid_approx", "sigmoid_via_tanh_approx", "logsigmoid",
             "logsigmoid_approx", "tanh_gpu"]
    which = [0, 1, 2, 3, 4, 5, 6, 7] if not dry else [0, 2]
    res = {}
    xd = x.double()
    for w in which:
        y = torch.empty_like(x)
        _apply[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), WHICH=w, BLOCK=1024)
        ref = torch.tanh(xd) if w < 2 or w == 7 else torch.sigmoid(xd) if w < 5 else torch.nn.functional.logsigmoid(xd)
        yd = y.double()
        nz = ref.abs() > 1e-30
        rel = ((yd - ref).abs() / ref.abs().clamp_min(1e-300))[nz]
        mid = (x.abs() > 0.05) & (x.abs() < 5)
        r = {"max_rel": rel.max().item(), "max_abs": (yd - ref).abs().max().item(),
             "mean_signed_rel_0.05<|x|<5": ((yd - ref) / ref)[mid & nz].mean().item(),
             "nan_ok": bool(torch.equal(y.isnan(), ref.isnan()))}
        if 2 <= w < 5:  # (1 - |tanh| near saturation is below fp32's resolution there for either emission: not measured)
            neg = (x < -2) & (ref > 1e-30)
            r["max_rel_x<-2"] = ((yd - ref).abs() / ref)[neg].max().item()
            r["min_value"] = y.min().item()
        if w == 0:
            y_tanh = y
        if w == 7:  # the exact GPU form: tanh's own bits, not an approximation of them
            same = (y.view(torch.int32) == y_tanh.view(torch.int32)) | (y.isnan() & y_tanh.isnan())
            r["bits_differ_from_tanh"] = int((~same).sum().item())
        res[names[w]] = r
        if w in (0, 1):
            # tanh-GELU in fp32 with this tanh, rounded to bf16, against the float64 GELU rounded to bf16
            xg = x[(x.abs() <= 10)]
            u = 0.7978845608028654 * (xg + 0.044715 * xg * xg * xg)
            t = torch.empty_like(u)
            _apply[(triton.cdiv(u.numel(), 1024),)](u, t, u.numel(), WHICH=w, BLOCK=1024)
            gl = (0.5 * xg * (1.0 + t)).to(torch.bfloat16)
            xd_ = xg.double()
            gref = 0.5 * xd_ * (1 + torch.tanh(0.7978845608028654 * (xd_ + 0.044715 * xd_ ** 3)))
            gb = gref.to(torch.bfloat16)
            ulp = (gb.double().abs().clamp_min(1e-30).log2().floor() - 7).exp2()
            d = ((gl.double() - gb.double()).abs() / ulp)
            res[f"gelu_bf16_with_{names[w]}"] = {
                "frac_differs": (gl != gb).double().mean().item(), "max_ulps": d.max().item(),
                "max_ulps_|g|>0.05": d[gref.abs() > 0.05].max().item(),
                "max_rel_vs_fp64": ((gl.double() - gref).abs() / gref.abs().clamp_min(1e-30))[
                    gref.abs() > 1e-6].max().item(),
                "norm_rel_vs_fp64": ((gl.double() - gref).norm() / gref.norm()).item()}
    return res


# ------------------------------------------------------------------------------------------------ phase 1
def _errors(outs, refs) -> list:
    from evtorch.testing import rel_error

    outs = outs if isinstance(outs, tuple) else (outs,)
    refs = refs if isinstance(refs, tuple) else (refs,)
    return [{"max": max_error(o, r), "fro": rel_error(o, r.to(o.dtype) if o.dtype != r.dtype else r)}
            for o, r in zip(outs, refs)]


def worker(args) -> int:
    import torch

    import evtorch as evt
    from evtorch.api import get_epilogue
    from evtorch.codegen.configs import GemmConfig
    from evtorch.codegen.program import build_program
    from evtorch.examples import EXAMPLES, eager_reference, operands
    from evtorch.testing import TOLERANCE, Case, check, all_cases
    from evtorch.testing import operands as case_operands

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    kw_backend = {} if dev == "cuda" else {"backend": "triton"}
    dtype16 = torch.bfloat16 if dev == "cuda" else torch.float16
    cases = {c.name: c for c in all_cases()}
    templates = {"portable": GemmConfig("portable", 64, 64, 32, 8, 1, 4, 3),
                 "splitk": GemmConfig("splitk", 64, 64, 64, 8, 4, 4, 3),
                 "persistent_tma": GemmConfig("persistent_tma", 128, 128, 64, 8, 1, 8, 3,
                                              (("EPILOGUE_SUBTILE", True),))}
    results = []
    shapes = SHAPES if not args.dry_run else ((64, 64, 32), (64, 32, 32))
    for job in worker_share(args):
        rec = {"job": job}
        parts = job.split("|")
        t = time.time()
        try:
            kind, mode = parts[0], parts[-1]
            os.environ["EVTORCH_FAST_MATH"] = mode
            if kind == "W":  # workload, config (base or a tuning candidate's short name), mode
                name, cname = parts[1], parts[2]
                cfg = base_config() if cname == "base" else next(
                    c for c in tune_candidates(*SHAPES[0]) if c.short() == cname)
                fn, mk = workload(name)
                rec["shapes"] = {}
                for (M, N, K) in (shapes if cname == "base" else shapes[1:]):
                    torch.manual_seed(1234 + M + N + K)
                    A, B = operands(M, N, K, dev, dtype16)
                    inputs = mk(M, N, dev, A.dtype)
                    out = poisoned(lambda: evt.gemm(A, B, fn, config=cfg, **kw_backend, **inputs))
                    rec["shapes"][f"{M}x{N}x{K}"] = _errors(out, eager_reference(fn, A, B, **inputs))
                    if cname == "base" and "kernels" not in rec:
                        ep = get_epilogue(fn, (M, N), torch.float32, inputs)
                        prog = build_program(ep, out_dtype=A.dtype, fast_math=mode if dev == "cuda" else "never")
                        rec["program"] = prog.key[0]
                        rec["kernels"] = kernel_rows(prog.module, set())
                    del out, A, B, inputs
            elif kind == "C":  # evtorch.testing case, dtype, mode
                dtype = getattr(torch, parts[2])
                M, N, K, L = (257, 193, 129, 3) if not args.dry_run else (37, 45, 29, 3)
                rec["errs"] = check(cases[parts[1]], M=M, N=N, K=K, L=L, device=dev, dtype=dtype)
                rec["ok"] = True
            elif kind == "T":  # example on a forced template, as evtorch.selftest
                ex, cfg, dtype = EXAMPLES[parts[1]], templates[parts[2]], getattr(torch, parts[3])
                case = Case(f"template_{parts[2]}_{parts[1]}", ex.fn,
                            lambda M, N, L, d, t, ex=ex: ex.make_inputs(M, N, d, t))
                M, N, K = (512, 384, 1024) if not args.dry_run else (64, 48, 32)
                A, B = case_operands(case, M, N, K, 1, dev, dtype)
                kw = case.make_inputs(M, N, 1, dev, dtype)
                out = poisoned(lambda: evt.gemm(A, B, case.fn, config=cfg if dev == "cuda" else None, **kw_backend,
                                                **kw))
                ref = case.fn(A.double() @ B.double(), **{k: v.double() if torch.is_tensor(v) and
                                                          v.is_floating_point() else v for k, v in kw.items()})
                out = out if isinstance(out, tuple) else (out,)
                ref = ref if isinstance(ref, tuple) else (ref,)
                from evtorch.testing import rel_error
                rec["errs"] = [rel_error(o, r.to(o.dtype) if o.dtype in (torch.float16, torch.bfloat16) else r)
                               for o, r in zip(out, ref)]
                lim = max(TOLERANCE[dtype], 1e-2)
                rec["ok"] = all(e <= lim for e in rec["errs"])
        except Exception as exc:  # noqa: BLE001
            os.environ.pop("EVTORCH_POISON", None)
            rec["error"] = f"{type(exc).__name__}: {exc}"[:1200]
            rec["ok"] = False
            traceback.print_exc()
        os.environ.pop("EVTORCH_FAST_MATH", None)
        rec["s"] = round(time.time() - t, 1)
        print("JOB", json.dumps(rec, default=str)[:500], flush=True)
        results.append(rec)
        tmp = Path(args.result + ".tmp")  # after every job: a worker killed at the phase deadline keeps its records
        tmp.write_text(json.dumps(results, default=str))
        tmp.replace(args.result)
    return 0


def make_jobs(dry: bool) -> tuple[list, dict]:
    import torch

    modes = {name: distinct_modes(*workload(name)) for name in WORKLOADS}
    jobs = []
    heavy = sorted(WORKLOADS, key=lambda w: -len(modes[w]))
    for w in heavy:
        for m in modes[w]:
            jobs.append(f"W|{w}|base|{m}")
    if not dry:
        for w in heavy:
            if len(modes[w]) > 1:
                for c in tune_candidates(*SHAPES[0])[1:]:
                    for m in modes[w]:
                        jobs.append(f"W|{w}|{c.short()}|{m}")
    for case in affected_cases():
        cm = distinct_modes(case.fn, lambda M, N, d, t, case=case: case.make_inputs(M, N, 3, d, t)) \
            if not case.batched else list(MODES)
        for d in ("bfloat16", "float16"):
            for m in (cm if len(cm) > 1 else MODES[:2]):
                jobs.append(f"C|{case.name}|{d}|{m}")
    from evtorch.examples import EXAMPLES

    for ex in ("row_reduction", "bce_loss"):
        em = distinct_modes(EXAMPLES[ex].fn, EXAMPLES[ex].make_inputs)
        for tpl in ("portable", "splitk", "persistent_tma"):
            for d in ("bfloat16", "float16"):
                for m in em:
                    jobs.append(f"T|{ex}|{tpl}|{d}|{m}")
    if dry:
        jobs = [j for j in jobs if j.startswith("W|") and "|base|" in j][:3] + \
            [j for j in jobs if j.startswith("C|")][:2] + [j for j in jobs if j.startswith("T|") and "|portable|" in j][:1]
    del torch
    return jobs, modes


def phase1_start(args, log, jobs):
    procs, logf = start_workers("benchmarks.fastmath_check", args, jobs, log)
    if not args.dry_run:
        procs.append(subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu",
                                       "tests/test_fast_math.py"], env=worker_env(TRITON_INTERPRET="0"), cwd=ROOT,
                                      stdout=open(Path(args.scratch) / "pytest_gpu.log", "w"),
                                      stderr=subprocess.STDOUT))
    return procs, logf


def phase1_finish(args, log, procs, logf, t_start) -> dict:
    res = finish_workers(args, procs, logf, t_start, log)
    scratch = Path(args.scratch)
    pt = scratch / "pytest_gpu.log"
    gpu_tests = pt.read_text()[-600:] if pt.exists() else "not run"
    log(f"phase 1: {len(res)} jobs done in {time.time() - t_start:.0f} s; pytest -m gpu: "
        f"{gpu_tests.strip().splitlines()[-1] if gpu_tests.strip() else '?'}")
    return {"jobs": res, "pytest_gpu": gpu_tests}


# ------------------------------------------------------------------------------------------------ phase 2
def phase2(args, b, results, modes) -> None:
    import torch

    import evtorch as evt
    import evtorch.runtime.gemm as rg

    cfg = base_config()
    shapes = SHAPES if not args.dry_run else ((64, 64, 32),)
    names = sorted(WORKLOADS, key=lambda w: -len(modes[w])) if not args.dry_run else ("bias_gelu_aux",)
    kw = {} if b.cuda else {"backend": "triton"}
    rows = {}

    def timed(fn, mode):
        os.environ["EVTORCH_FAST_MATH"] = mode
        try:
            return b.graph_timer(fn) if b.cuda else b.timer(fn)
        finally:
            os.environ.pop("EVTORCH_FAST_MATH", None)

    # forced config, modes interleaved twice
    for M, N, K, A, B, name, fn, inputs in workload_rows(b, shapes, names, workload, skip_s=25):
        row = {"workload": name, "shape": [M, N, K], "modes": modes[name], "forced": {}, "tuned": {}}
        rows[(name, M, N, K)] = row
        results["timing"].append(row)
        row["cublas_ms"] = b.timer(lambda: torch.matmul(A, B))
        for rep in range(2):
            for m in modes[name]:
                row["forced"].setdefault(m, []).append(
                    timed(lambda: evt.gemm(A, B, fn, config=cfg, **kw, **inputs), m))
        row["cublas_ms_after"] = b.timer(lambda: torch.matmul(A, B))
        c = row["cublas_ms"]
        b.log(f"{name:15s} {M}x{N}x{K} cuBLAS {c:.4f} | " + " ".join(
            f"{m}=" + "/".join(f"{v / c:.3f}" if v else "FAIL" for v in vs) for m, vs in row["forced"].items()))
        b.save()
    if args.dry_run or not b.cuda:
        return
    os.environ["EVTORCH_AUTOTUNE"] = "1"
    rg.MAX_TUNE_CANDIDATES = 5
    tuned = [name for name in names if len(modes[name]) >= 2]
    # tuned default (fresh tuning: workers ran with EVTORCH_AUTOTUNE=0)
    for M, N, K, A, B, name, fn, inputs in workload_rows(b, shapes, tuned, workload, skip_s=20, dtype=torch.bfloat16,
                                                         tag="SKIP tuned"):
        if (name, M, N, K) not in rows:
            continue
        row = rows[(name, M, N, K)]
        for m in modes[name]:
            os.environ["EVTORCH_FAST_MATH"] = m
            try:
                t = time.time()
                config = tuned_config(fn, A, B, inputs)
                rec = {"tune_s": round(time.time() - t, 1), "config": config}
            finally:
                os.environ.pop("EVTORCH_FAST_MATH", None)
            rec["ms"] = timed(lambda: evt.gemm(A, B, fn, **inputs), m)
            row["tuned"][m] = rec
        row["cublas_ms_after_tuned"] = b.timer(lambda: torch.matmul(A, B))
        b.log(f"{name:15s} {M}x{N}x{K} tuned: " + " ".join(
            f"{m}={r['ms'] / row['cublas_ms']:.3f} ({r['config']})" if r.get("ms") else f"{m}=FAIL"
            for m, r in row["tuned"].items()))
        b.save()


def main() -> int:
    ap = parser("fastmath", deadline_s=310.0, phase1_s=165.0, workers=14)
    args = ap.parse_args()
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"
        args.workers = min(args.workers, 2)
    os.environ.setdefault("EVTORCH_CACHE_DIR", "/tmp/evtorch_fastmath_cache")
    if args.worker:
        return worker(args)

    from benchmarks.harness import Harness

    results = {"env": {}, "approximations": None, "phase1": None, "timing": []}
    b = Harness(args, "fastmath", results, cuda=not args.dry_run, warmup_ms=25.0, rep_ms=100.0, t0=T0)
    b.dev = "cuda" if b.cuda else "cpu"
    import torch
    import triton

    results["env"] = {"torch": torch.__version__, "triton": triton.__version__,
                      "device": torch.cuda.get_device_name() if b.cuda else "cpu (interpreter)",
                      "driver": _driver() if b.cuda else None, "argv": sys.argv[1:],
                      "base_config": base_config().short()}
    b.log("ENV", json.dumps(results["env"]))
    jobs, modes = make_jobs(args.dry_run)
    results["modes"] = modes
    t1 = time.time()
    procs, logf = phase1_start(args, b.log, jobs)
    if b.cuda:
        try:
            results["approximations"] = approximations(args.dry_run)
        except Exception as exc:  # noqa: BLE001
            results["approximations"] = {"error": f"{type(exc).__name__}: {exc}"[:800]}
        b.log("APPROX", json.dumps(results["approximations"]))
        b.save()
    results["phase1"] = phase1_finish(args, b.log, procs, logf, t1)
    b.save()
    phase2(args, b, results, modes)
    b.save()
    summary(b, results)
    return 0


def _driver():
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception:  # noqa: BLE001
        return None


def summary(b, results) -> None:
    b.log("\nCORRECTNESS (max error over the fp32 reference per output; relative Frobenius in brackets):")
    jobs = results["phase1"]["jobs"]
    for rec in jobs:
        if rec["job"].startswith("W|") and "|base|" in rec["job"]:
            ks = rec.get("kernels", [])
            kt = ";".join(f"{k['n_regs']}/{k['n_spills']}" for k in ks)
            errs = " ".join(f"{s}: " + ",".join(f"{e['max']:.1e}[{e['fro']:.1e}]" for e in v)
                            for s, v in rec.get("shapes", {}).items())
            b.log(f"  {rec['job'][2:]:32s} regs/spills {kt:10s} {errs} {rec.get('error', '')[:200]}")
    for kind, label in (("C|", "testing cases"), ("T|", "templates x examples"), ("W|", "all workload jobs")):
        sel = [r for r in jobs if r["job"].startswith(kind)]
        bad = [r for r in sel if r.get("error") or r.get("ok") is False]
        b.log(f"{label}: {len(sel) - len(bad)}/{len(sel)} ok")
        for r in bad[:12]:
            b.log("  BAD", json.dumps(r, default=str)[:400])
    worst: dict = {}
    for r in jobs:
        if r["job"][0] in "CT" and r.get("errs"):
            m = r["job"].split("|")[-1]
            worst[m] = max(worst.get(m, 0.0), max(r["errs"]))
    b.log("max relative (Frobenius) error over testing cases + templates, per mode: "
          + ", ".join(f"{m} {v:.2e}" for m, v in worst.items()))
    b.log("\nTIME / cuBLAS (CUDA-graph replay; forced " + results["env"].get("base_config", "") + ", each mode "
          "twice interleaved; tuned default per mode):")
    for row in results["timing"]:
        c = row["cublas_ms"]
        f = " ".join(f"{m} " + "/".join(f"{v / c:.3f}" if v else "FAIL" for v in vs)
                     for m, vs in row["forced"].items())
        t = " ".join(f"{m} {r['ms'] / c:.3f}" if r.get("ms") else f"{m} FAIL" for m, r in row["tuned"].items())
        b.log(f"{row['workload']:15s} {'x'.join(map(str, row['shape'])):16s} {c:.4f} | {f} | tuned {t}"
              f"  (cuBLAS after {row.get('cublas_ms_after', float('nan')):.4f})")
    b.log(f"total {time.time() - T0:.0f} s")


if __name__ == "__main__":
    sys.exit(main())

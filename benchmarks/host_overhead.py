"""Host overhead of evtorch calls: the Python time per call with the kernel launches stubbed out.

    python benchmarks/host_overhead.py                 # CPU, Triton interpreter, launches replaced by no-ops
    python benchmarks/host_overhead.py --device cuda   # CUDA tensors and allocator, launches still no-ops
    python benchmarks/host_overhead.py --profile linear_fwd_bwd   # cProfile of one case (SORT=cumtime ...)
    python benchmarks/host_overhead.py --device cuda --real       # real launches: Triton's launcher included

What is measured is everything evtorch does on the host for one call: argument checks, plan and launch lookups,
output / buffer allocation, autograd bookkeeping, argument lists, the launcher's own Python, down to the point
where a Triton kernel is launched. The kernels of every generated module are replaced by stubs whose
``kernel[grid](*args, **kw)`` does nothing, so the numbers are host time without Triton's own launch cost (a few
microseconds per kernel on a GPU) and without device work. On CPU the tensors go through ``backend="triton"``
with the Triton interpreter's import path; they are small so that allocation costs about what a caching
allocator costs. With ``--device cuda`` the torch ops that are not evtorch kernels (output fills, the cast of a
bias gradient) are real, asynchronous launches.

Cases (microseconds per call: the lowest of 5 medians of ``--calls / 5`` calls, after a warm-up):

- ``torch_matmul_fwd``: ``torch.matmul(A, B)``, what a cuBLAS call costs on the host (with ``--real``);
- ``gemm_identity_fwd``: ``evt.gemm(A, B)`` (no grad);
- ``gemm_bias_gelu_fwd``: ``evt.gemm(A, B, bias_gelu, bias=b)`` (no grad);
- ``gemm_splitk_colsum_fwd``: the same epilogue with a column sum, forced onto split-K (4 splits): the workspace,
  the zero fill of the atomic column sum, the partial and reduce kernels;
- ``linear_fwd``: ``evt.linear(x, W, gelu, b)`` under ``torch.no_grad()``;
- ``linear_fwd_bwd``: ``evt.linear(x, W, gelu, b)`` with x, W, b requiring grad, then
  ``torch.autograd.grad(y, (x, W, b), gy)``: the forward kernel, the epilogue-only backward kernel, dA, dB;
- ``linear_fwd_bwd_compiled``: the same step compiled (``torch.compile(backend="aot_eager")``, the first call
  compiles during the warm-up): the forward and backward run as the operators ``evtorch::gemm`` and
  ``evtorch::gemm_backward`` behind AOTAutograd's runtime and the operators' dispatch;
- ``torch_floor_fwd_bwd``: what ``linear_fwd_bwd`` cannot go below in eager PyTorch: a bare
  ``torch.autograd.Function`` with the same inputs, outputs, saved tensors, allocations (forward: output and
  saved accumulator; backward: d(acc), the zero-filled bias gradient and its cast, dA, dB) and no other work;
- ``torch_linear_fwd_bwd``: what a user has without evtorch, eager PyTorch's ``gelu(linear(x, W, b))`` forward
  and backward with its own kernels (with ``--real``: the competitor's host time).

``--autograd-one-thread`` runs backward passes on the calling thread: on CUDA the autograd engine hands them to a
thread of its own per device, which cProfile (``--profile``) does not see and whose hand-off is part of every
backward's time.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time


class _StubKernel:
    """``kernel[grid](*args, **kwargs)`` that launches nothing. It keeps the replaced kernel's parameter list
    (``arg_names``, ``params``), which ``runtime.launcher.DirectLaunch`` reads when it is built for a CUDA
    device; its ``_jit`` then gets None from the stub and never caches a compiled kernel, so every call takes the
    direct launcher's own lookup and the stub."""

    def __init__(self, name, original=None):
        self.__name__ = name
        self.calls = 0
        self.arg_names = getattr(original, "arg_names", ())
        self.params = getattr(original, "params", ())

    def __getitem__(self, grid):
        return self._launch

    def _launch(self, *args, **kwargs):
        self.calls += 1


def stub_launches():
    """Replace every Triton kernel of every generated module (loaded now or later) by a stub."""
    import evtorch.codegen.program as program
    from evtorch.runtime import source_cache

    def stub_module(module):
        for name, value in list(vars(module).items()):
            kind = type(value).__name__
            if kind in ("JITFunction", "InterpretedFunction") and (name.startswith("gemm") or "vec" in name):
                setattr(module, name, _StubKernel(name, value))
        return module

    for module in list(source_cache._modules.values()):
        stub_module(module)
    original = source_cache.load_module
    if getattr(original, "_stubbed", False):
        return

    def load_module(source, name_hint):
        return stub_module(original(source, name_hint))
    load_module._stubbed = True
    program.load_module = load_module


def gelu(y):
    import torch.nn.functional as F
    return F.gelu(y, approximate="tanh")


def bias_gelu(acc, bias):
    import torch.nn.functional as F
    return F.gelu(acc + bias, approximate="tanh")


def bias_gelu_colsum(acc, bias):
    import torch.nn.functional as F
    y = F.gelu(acc + bias, approximate="tanh")
    return y, y.sum(dim=0)


def cases(M, N, K, dtype, device="cpu"):
    import torch

    import evtorch as evt
    from evtorch.codegen.configs import GemmConfig
    g = torch.Generator().manual_seed(0)

    def rnd(*shape, grad=False):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype).requires_grad_(grad)
    A, B, b = rnd(M, K), rnd(K, N), rnd(N)
    x, W, bl = rnd(M, K, grad=True), rnd(N, K, grad=True), rnd(N, grad=True)
    gy = rnd(M, N)

    def torch_matmul_fwd():
        torch.matmul(A, B)

    def gemm_identity_fwd():
        evt.gemm(A, B, backend="triton")

    def gemm_bias_gelu_fwd():
        evt.gemm(A, B, bias_gelu, bias=b, backend="triton")

    splitk = GemmConfig("splitk", 16, 64, 32, SPLIT_K=4, num_warps=4, num_stages=4)

    def gemm_splitk_colsum_fwd():
        evt.gemm(A, B, bias_gelu_colsum, bias=b, config=splitk, backend="triton")

    from benchmarks.workloads import bench_workload
    mixed, make_inputs = bench_workload("mixed_dag")
    mixed_inputs = make_inputs(M, N, device, dtype)

    def gemm_mixed_dag_fwd():
        evt.gemm(A, B, mixed, backend="triton", **mixed_inputs)

    def gemm_splitk_mixed_dag_fwd():
        evt.gemm(A, B, mixed, config=splitk, backend="triton", **mixed_inputs)

    def linear_fwd():
        with torch.no_grad():
            evt.linear(x, W, gelu, bl, backend="triton")

    def linear_fwd_bwd():
        y = evt.linear(x, W, gelu, bl, backend="triton")
        torch.autograd.grad(y, (x, W, bl), gy)

    compiled_step = torch.compile(lambda x, W, b: evt.linear(x, W, gelu, b, backend="triton"), backend="aot_eager")

    def linear_fwd_bwd_compiled():
        y = compiled_step(x, W, bl)
        torch.autograd.grad(y, (x, W, bl), gy)

    class Floor(torch.autograd.Function):
        @staticmethod
        def forward(ctx, A, B, bias):
            out = torch.empty(M, N, dtype=A.dtype, device=A.device)
            acc = torch.empty(M, N, dtype=A.dtype, device=A.device)
            ctx.save_for_backward(A, B, bias, acc)
            ctx.mark_non_differentiable(acc)
            ctx.set_materialize_grads(False)
            return out, acc

        @staticmethod
        def backward(ctx, g, _):
            A, B, bias, acc = ctx.saved_tensors
            torch.empty(M, N, dtype=A.dtype, device=A.device)  # d(acc)
            db = torch.full((N,), 0, dtype=torch.float32, device=A.device)
            dA = torch.empty(M, K, dtype=A.dtype, device=A.device)
            dB = torch.empty(N, K, dtype=A.dtype, device=A.device)
            return dA, dB, db.to(bias.dtype)

    def torch_floor_fwd_bwd():
        y, _ = Floor.apply(x, W, bl)
        torch.autograd.grad(y, (x, W, bl), gy)

    def torch_linear_fwd_bwd():  # what a user has without evtorch: eager PyTorch's linear + GELU, its own kernels
        y = torch.nn.functional.gelu(torch.nn.functional.linear(x, W, bl), approximate="tanh")
        torch.autograd.grad(y, (x, W, bl), gy)

    return {f.__name__: f for f in (torch_matmul_fwd, gemm_identity_fwd, gemm_bias_gelu_fwd, gemm_splitk_colsum_fwd,
                                    gemm_mixed_dag_fwd, gemm_splitk_mixed_dag_fwd, linear_fwd, linear_fwd_bwd,
                                    linear_fwd_bwd_compiled, torch_floor_fwd_bwd, torch_linear_fwd_bwd)}


def measure(fn, calls: int, warmup: int = 20, rounds: int = 5, sync=None) -> float:
    """Microseconds per call: the median of each of ``rounds`` rounds of ``calls / rounds`` calls, the lowest
    of those (other processes on the machine only ever add time)."""
    for _ in range(warmup):
        fn()
    medians = []
    for _ in range(rounds):
        times = []
        for _ in range(max(1, calls // rounds)):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        medians.append(statistics.median(times))
        if sync is not None:
            sync()
    return min(medians) * 1e6


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or "unknown"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--shape", type=int, nargs=3, default=(256, 256, 128), metavar=("M", "N", "K"))
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--only", nargs="*", help="case names to run")
    parser.add_argument("--real", action="store_true",
                        help="launch the kernels (GPU only): host time including Triton's launcher")
    parser.add_argument("--profile", metavar="CASE", help="cProfile one case and print the top functions")
    parser.add_argument("--autograd-one-thread", action="store_true",
                        help="run backward passes on the calling thread (torch.autograd.set_multithreading_enabled"
                             "(False)): on CUDA the engine otherwise hands them to a device thread, which cProfile "
                             "does not see, and the hand-off's cost is part of every backward")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
        if os.environ.get("TRITON_INTERPRET") != "1":
            print("host_overhead.py --device cpu needs TRITON_INTERPRET=1", file=sys.stderr)
            return 2
    elif os.environ.get("TRITON_INTERPRET") == "1":
        print("host_overhead.py --device cuda needs TRITON_INTERPRET unset", file=sys.stderr)
        return 2
    if args.real and args.device != "cuda":
        print("host_overhead.py --real needs --device cuda", file=sys.stderr)
        return 2
    import torch
    if not args.real:
        stub_launches()
    if args.autograd_one_thread:
        torch.autograd.set_multithreading_enabled(False)
    dtype = getattr(torch, args.dtype)
    all_cases = cases(*args.shape, dtype, args.device)
    sync = torch.cuda.synchronize if args.device == "cuda" else None
    if args.profile:
        import cProfile
        import pstats
        fn = all_cases[args.profile]
        measure(fn, 50, rounds=1)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.calls):
            fn()
        prof.disable()
        pstats.Stats(prof).sort_stats(os.environ.get("SORT", "tottime")).print_stats(35)
        return 0
    M, N, K = args.shape
    where = f"CPU {cpu_model()}" + (f", {torch.cuda.get_device_name()}" if args.device == "cuda" else "")
    launches = ("real launches" if args.real else "launches stubbed") + (
        ", backward on the calling thread" if args.autograd_one_thread else "")
    print(f"host time per call, {launches}: {M}x{N}x{K} {args.dtype} on {args.device}, {where}, "
          f"torch {torch.__version__}, lowest of 5 medians of {args.calls // 5} calls")
    results = {}
    for name, fn in all_cases.items():
        if args.only and name not in args.only:
            continue
        results[name] = round(measure(fn, args.calls, sync=sync), 1)
        print(f"  {name:<20} {results[name]:8.1f} us")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": args.device, "cpu": cpu_model(), "shape": [M, N, K], "dtype": args.dtype,
                       "torch": torch.__version__, "real": args.real, "autograd_one_thread": args.autograd_one_thread,
                       "us_per_call": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

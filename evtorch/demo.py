"""``evtorch demo``: run the example epilogues (``evtorch.examples``) and check each against eager PyTorch.

Each example gets fresh random operands and inputs, runs through ``evt.gemm`` (on CPU the reference
executor by default, on CUDA the fused Triton kernels) and is compared with ``fn(A.float() @ B.float(), **kw)``.
The result is a plain-text table; ``run_demo`` returns the rows so tests can inspect them.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch

from . import api
from .examples import EXAMPLES, eager_reference, operands

#: largest relative error (max |out - ref| / max |ref|, per output) accepted for each operand dtype;
#: full-size outputs are rounded to this dtype, so the bound is a few of its ulps
TOLERANCE = {torch.float16: 5e-3, torch.bfloat16: 3e-2, torch.float32: 1e-4, torch.float64: 1e-10}


@dataclass
class Row:
    name: str
    shapes: str = ""
    max_err: float = float("nan")
    rel_err: float = float("nan")
    ms: float = float("nan")
    ok: bool = False
    error: str | None = None


def default_size(device: str, backend: str | None) -> tuple[int, int, int]:
    """(M, N, K): large on CUDA, small on CPU, tiny for the Triton interpreter (it runs kernels in Python)."""
    if device.startswith("cuda"):
        return 4096, 4096, 4096
    if backend == "triton":
        return 96, 80, 64
    return 512, 384, 256


def compare(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(max abs error, that error relative to max |ref|); equal infs and NaN in both places count as equal."""
    if tuple(out.shape) != tuple(ref.shape):
        raise AssertionError(f"shape {tuple(out.shape)} but the eager reference has {tuple(ref.shape)}")
    o, r = out.double(), ref.double()
    diff = (o - r).abs()
    diff[(o == r) | (o.isnan() & r.isnan())] = 0.0
    max_err = diff.max().item() if diff.numel() else 0.0
    finite = r[r.isfinite()].abs()
    scale = finite.max().item() if finite.numel() else 0.0
    return max_err, max_err / max(scale, 1e-30)


def _as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _shape_str(t: torch.Tensor) -> str:
    return "x".join(map(str, t.shape)) if t.dim() else "scalar"


def _sync(device: str):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run_example(name: str, M: int, N: int, K: int, device: str, dtype: torch.dtype, backend: str | None = None,
                repeat: int = 5) -> Row:
    """Run one example once for the check (and to trace, compile and tune), then ``repeat`` more times back to
    back for the timing: the mean wall-clock time per call, the device synchronized before and after."""
    fn, make_inputs = EXAMPLES[name]
    row = Row(name)
    try:
        A, B = operands(M, N, K, device, dtype)
        kw = make_inputs(M, N, device, dtype)
        outs = _as_tuple(api.gemm(A, B, fn, backend=backend, **kw))
        refs = _as_tuple(eager_reference(fn, A, B, **kw))
        row.shapes = ", ".join(_shape_str(o) for o in outs)
        if len(outs) != len(refs):
            raise AssertionError(f"{len(outs)} outputs but the eager function returns {len(refs)}")
        errors = [compare(o, r) for o, r in zip(outs, refs)]
        row.max_err = max(e[0] for e in errors)
        row.rel_err = max(e[1] for e in errors)
        row.ok = row.rel_err <= TOLERANCE[dtype]
        if repeat > 0:
            _sync(device)
            t0 = time.perf_counter()
            for _ in range(repeat):
                api.gemm(A, B, fn, backend=backend, **kw)
            _sync(device)
            row.ms = (time.perf_counter() - t0) / repeat * 1e3
    except Exception as e:  # one broken example must not hide the others; the row and the exit code say so
        row.ok = False
        row.error = f"{type(e).__name__}: {e}"
    return row


def run_demo(M: int, N: int, K: int, device: str, dtype: torch.dtype, backend: str | None = None,
             repeat: int = 5, names=None, seed: int = 0) -> list[Row]:
    torch.manual_seed(seed)
    return [run_example(n, M, N, K, device, dtype, backend, repeat) for n in (names or EXAMPLES)]


def _num(x: float, fmt: str) -> str:
    return "-" if x != x else format(x, fmt)


def format_table(rows: list[Row]) -> str:
    header = ("example", "outputs", "max err", "rel err", "time ms", "check")
    body = [(r.name, r.shapes or "-", _num(r.max_err, ".2e"), _num(r.rel_err, ".2e"), _num(r.ms, ".3f"),
             "pass" if r.ok else ("ERROR" if r.error else "FAIL")) for r in rows]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    right = {2, 3, 4}
    fmt = lambda line: "  ".join(c.rjust(w) if i in right else c.ljust(w)  # noqa: E731
                                 for i, (c, w) in enumerate(zip(line, widths))).rstrip()
    lines = [fmt(header), fmt(tuple("-" * w for w in widths)), *map(fmt, body)]
    lines += [f"{r.name}: {r.error}" for r in rows if r.error]
    return "\n".join(lines)


def demo(device: str | None = None, size: tuple[int, int, int] | None = None, dtype: torch.dtype = torch.float16,
         backend: str | None = None, repeat: int = 5, names=None, seed: int = 0) -> int:
    """Print the demo table; returns the process exit code (0 when every example matches eager)."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    M, N, K = size or default_size(device, backend)
    if backend == "triton" and not device.startswith("cuda"):
        os.environ.setdefault("TRITON_INTERPRET", "1")  # generated kernels on CPU tensors need Triton's interpreter
    used = backend or ("triton" if device.startswith("cuda") else "reference")
    print(f"evtorch demo: device {device}, backend {used}, A ({M}, {K}) @ B ({K}, {N}) in {str(dtype)[6:]}, "
          f"seed {seed}; each example checked against fn(A.float() @ B.float(), **inputs), "
          f"rel err tolerance {TOLERANCE[dtype]:.0e}")
    rows = run_demo(M, N, K, device, dtype, backend, repeat, names, seed)
    print(format_table(rows))
    failed = [r.name for r in rows if not r.ok]
    if failed:
        print(f"{len(failed)} of {len(rows)} examples failed: {', '.join(failed)}")
        return 1
    print(f"all {len(rows)} examples match eager PyTorch")
    return 0

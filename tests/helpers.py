"""Shared test utilities: random data with edge values, output poisoning, comparison with eager PyTorch.

The contract under test (issue "Core"): ``evt.gemm(A, B, fn, **kw)`` equals ``fn(A.float() @ B.float(), **kw)``
(``A.double() @ B.double()`` for float64 operands), with full-size floating outputs cast to ``A.dtype`` (or
``out_dtype``), reduction (vector-stage) outputs in float32 (float64 for float64 GEMMs) and bool/integer
outputs in their own dtype.

``check_gemm`` runs both sides and compares; ``check_reference`` does the same for an arbitrary accumulator
(edge values such as inf and NaN cannot be produced through a matmul reliably) through ``evt.trace`` and
``Epilogue.reference``. Both take a ``runner`` so the same checks can drive another backend (the Triton
interpreter) later: ``runner(A, B, fn, **kw)`` must behave like ``evt.gemm``.

Comparison rules (``assert_matches``):

- shapes equal; dtypes follow the contract above;
- NaN in the result only where eager is NaN (a NaN never passes otherwise);
- where eager is NaN or infinite, the result must be the same, unless ``hi`` (eager run in float64) is given
  and the result matches that instead: float32 torch kernels are sometimes less exact than evtorch's
  decomposition (``F.gelu(inf)`` is NaN in torch's vectorised float32 kernel, ``inf`` in float64);
- finite values within ``atol + rtol * |eager|`` (tolerances chosen by output dtype), or of ``hi``;
- a mismatch where eager met a max / min of +0 and -0 (whose winner torch picks by kernel path) raises
  ``EagerIllDefined`` instead of a plain AssertionError; random DAG tests reject such an example.
"""
from __future__ import annotations

import math
import os
from typing import Callable

import torch
from torch.overrides import TorchFunctionMode

import evtorch as evt

# every test output starts as NaN / True / -1, so an element the executor forgets to write fails the test
os.environ.setdefault("EVTORCH_POISON", "1")

#: values every elementwise op is checked on (besides random normal data)
EDGE_VALUES = (0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.5, -2.5, 3.0, -3.0, 6.0, -6.0, 20.0, 20.5, -20.0, 1e-8, -1e-8,
               88.0, -88.0, 1e4, -1e4, 3e38, -3e38, math.inf, -math.inf, math.nan)
FINITE_EDGE_VALUES = tuple(v for v in EDGE_VALUES if math.isfinite(v))

#: (rtol, atol) per result dtype
TOLERANCES = {
    torch.float64: (1e-10, 1e-10),
    torch.float32: (2e-5, 2e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def rand(shape, dtype=torch.float32, *, seed: int = 0, edge: bool = False, special: bool = True,
         scale: float = 1.0, positive: bool = False, fraction: float = 0.3, huge: bool = True) -> torch.Tensor:
    """Normal random data; with ``edge`` a ``fraction`` of the elements (and always one of each edge value when
    there is room) replaced by edge values (``special``: including inf and NaN; ``huge``: including +-3e38, next
    to float32's largest, where the order of a kernel's internal operations decides whether it overflows).
    ``positive`` takes ``abs``."""
    g = gen(seed)
    x = torch.randn(tuple(shape), generator=g, dtype=torch.float64) * scale
    if edge and x.numel():
        values = [v for v in (EDGE_VALUES if special else FINITE_EDGE_VALUES) if huge or abs(v) != 3e38]
        values = torch.tensor(values, dtype=torch.float64)
        flat = x.view(-1)
        n = max(int(flat.numel() * fraction), min(len(values), flat.numel()))
        pos = torch.randperm(flat.numel(), generator=g)[:n]
        pick = torch.cat([torch.arange(len(values)), torch.randint(0, len(values), (n,), generator=g)])[:n]
        flat[pos] = values[pick]
    if positive:
        x = x.abs()
    return x.to(dtype)


def rand_int(shape, low: int, high: int, *, seed: int = 0, dtype=torch.int64) -> torch.Tensor:
    return torch.randint(low, high, tuple(shape), generator=gen(seed), dtype=dtype)


def operands(M, N, K, dtype=torch.float32, *, L=None, batched_b=True, seed=0, scale=1.0):
    """Random A, B (float64 generation, then cast): A (M, K) or (L, M, K); B (K, N), (L, K, N) if batched_b."""
    a_shape = (M, K) if L is None else (L, M, K)
    b_shape = (L, K, N) if L is not None and batched_b else (K, N)
    return rand(a_shape, dtype, seed=seed, scale=scale), rand(b_shape, dtype, seed=seed + 1, scale=scale)


def eager_acc(A: torch.Tensor, B: torch.Tensor, dtype=None) -> torch.Tensor:
    dtype = dtype or (torch.float64 if A.dtype == torch.float64 else torch.float32)
    return torch.matmul(A.to(dtype), B.to(dtype))


def upcast(value):
    """Floating tensors to float64 (the high-precision eager reference); anything else unchanged."""
    if isinstance(value, torch.Tensor) and value.dtype.is_floating_point:
        return value.double()
    return value


def as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


class EagerIllDefined(AssertionError):
    """Eager's result differs from evtorch's only where eager itself is not defined: a max / min of +0 and -0, whose
    winner torch picks by kernel path (``torch.maximum(0.0, -0.0)`` gives +0 broadcast from a column and -0
    elementwise on CPU, float64), and the zero's sign mattered later (``1 / x``: +inf against -inf). Random DAG
    tests reject such an example instead of failing on it."""


# ops whose result, where two operands (or two elements of a reduced slice) are +0 and -0, is either zero
_ZERO_TIE_OPS = {"maximum", "minimum", "max", "min", "amax", "amin", "fmax", "fmin", "clamp", "clamp_min",
                 "clamp_max", "clip"}


def _zero_tie(name: str, args, kwargs) -> bool:
    """Whether a call of one of ``_ZERO_TIE_OPS`` met a +0 / -0 tie: between two operands (numbers included) at
    one position, or, for a reduction, anywhere in its input (conservative)."""
    binary = len(args) > 1 and isinstance(args[1], torch.Tensor)
    if name in ("amax", "amin") or (name in ("max", "min") and not binary):
        x = args[0] if args else kwargs.get("input")
        zero = x == 0
        return x.is_floating_point() and bool((zero & x.signbit()).any()) and bool((zero & ~x.signbit()).any())
    operands = [torch.as_tensor(v) for v in (*args[:3], kwargs.get("min"), kwargs.get("max"), kwargs.get("other"))
                if isinstance(v, (torch.Tensor, float, int)) and not isinstance(v, bool)]
    zeros = [(t == 0, t.double().signbit()) for t in operands]
    return any(bool((zi & zj & (si != sj)).any()) for i, (zi, si) in enumerate(zeros) for zj, sj in zeros[i + 1:])


class _Precision(TorchFunctionMode):
    """Records the least precise floating dtype any torch call produced while eager ran the epilogue, and whether
    a max / min met a +0 / -0 tie (``EagerIllDefined``)."""

    def __init__(self):
        super().__init__()
        self.lowest = None
        self.zero_tie = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = getattr(func, "__name__", "").rstrip("_")
        if not self.zero_tie and name in _ZERO_TIE_OPS:
            self.zero_tie = _zero_tie(name, args, kwargs)
        for t in as_tuple(out):
            if isinstance(t, torch.Tensor) and t.dtype in TOLERANCES and (
                    self.lowest is None or TOLERANCES[t.dtype][0] > TOLERANCES[self.lowest][0]):
                self.lowest = t.dtype
        return out


def eager(fn: Callable, acc: torch.Tensor, **inputs):
    return as_tuple(fn(acc, **inputs))


def eager_with_precision(fn: Callable, acc: torch.Tensor, *, ties: list | None = None, **inputs):
    """(eager outputs, the least precise floating dtype eager computed anything in); with ``ties``, appends
    whether a max / min met a +0 / -0 tie."""
    with _Precision() as rec:
        out = as_tuple(fn(acc, **inputs))
    if ties is not None:
        ties.append(rec.zero_tie)
    return out, rec.lowest


def eager_hi(fn: Callable, acc: torch.Tensor, **inputs):
    """``fn`` on float64 acc and inputs, or None where eager float64 cannot run it."""
    try:
        return as_tuple(fn(acc.double(), **{k: upcast(v) for k, v in inputs.items()}))
    except Exception:  # noqa: BLE001  (e.g. a dtype rule that needs the original dtype)
        return None


def tolerance(dtype: torch.dtype, scale: float = 1.0):
    rtol, atol = TOLERANCES.get(dtype, (0.0, 0.0))
    return rtol * scale, atol * scale


def _close(got64, want64, rtol, atol):
    same = (got64 == want64) | (got64.isnan() & want64.isnan())
    both_finite = got64.isfinite() & want64.isfinite()
    near = both_finite & ((got64 - want64).abs() <= atol + rtol * want64.abs())
    return same | near


def assert_matches(got: torch.Tensor, want: torch.Tensor, *, hi: torch.Tensor | None = None,
                   dtype: torch.dtype | None = None, rtol=None, atol=None, what: str = "output",
                   sign_of_zero: bool = False):
    """``got`` equals eager ``want`` elementwise by the rules in the module docstring."""
    assert isinstance(got, torch.Tensor), f"{what}: expected a tensor, got {type(got).__name__}"
    assert tuple(got.shape) == tuple(want.shape), f"{what}: shape {tuple(got.shape)} != eager {tuple(want.shape)}"
    if dtype is not None:
        assert got.dtype == dtype, f"{what}: dtype {got.dtype}, expected {dtype}"
    if got.numel() == 0:
        return
    if not want.dtype.is_floating_point and not got.dtype.is_floating_point:
        assert torch.equal(got.long(), want.long()), f"{what}: integer/bool values differ:\n{got}\n{want}"
        return
    d_rtol, d_atol = tolerance(got.dtype if got.dtype.is_floating_point else torch.float32)
    rtol = d_rtol if rtol is None else rtol
    atol = d_atol if atol is None else atol
    g, w = got.double(), want.double()
    ok = _close(g, w, rtol, atol)
    if hi is not None:
        h = hi.double().expand(w.shape) if hi.shape != w.shape else hi.double()
        ok = ok | _close(g, h, rtol, atol)
    # a NaN result passes only where eager is NaN too (never through the high-precision reference)
    ok = ok & ~(g.isnan() & ~w.isnan())
    # zeros carry their sign (1 / x tells them apart): where both are exactly zero, the signs must agree (opt-in:
    # which zero torch.maximum(0.0, -0.0) or amax returns depends on its kernel path, i.e. on memory layout)
    if sign_of_zero:
        ok = ok & ~((g == 0) & (w == 0) & (torch.signbit(g) != torch.signbit(w)))
    if not bool(ok.all()):
        bad = (~ok).nonzero()[:8].tolist()
        detail = ", ".join(f"{tuple(i)}: got {g[tuple(i)].item()!r} eager {w[tuple(i)].item()!r}"
                           + (f" eager64 {h[tuple(i)].item()!r}" if hi is not None else "") for i in bad)
        raise AssertionError(f"{what}: {int((~ok).sum())} of {ok.numel()} elements differ from eager "
                             f"(rtol={rtol}, atol={atol}): {detail}")


def expected_dtype(ep: evt.Epilogue, position: int, want: torch.Tensor, out_dtype: torch.dtype) -> torch.dtype:
    """The contract's dtype for output ``position`` (docs/epilogues.md, "Dtypes"): bool/int keep theirs, full-size
    floats take out_dtype, reductions and other outputs that do not span M and N the accumulator's (float32,
    float64 for float64 GEMMs)."""
    o = next(o for o in ep.outputs if o.position == position)
    if not o.dtype.is_floating_point:
        return want.dtype
    if o.kind == "tile" and ep.full_size(o):
        return out_dtype
    return ep.acc_dtype


def compare_outputs(ep, got, want, hi, *, out_dtype, outputs=None, rtol=None, atol=None, lowest=None,
                    sign_of_zero=False):
    got = as_tuple(got)
    assert len(got) == len(want), f"{len(got)} outputs, eager returned {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        if outputs is not None and i not in outputs:
            assert g is None, f"output {i} was not asked for (outputs={outputs}) but was computed"
            continue
        dtype = expected_dtype(ep, i, w, out_dtype)
        h = None if hi is None else hi[i]
        r, a = rtol, atol
        if dtype.is_floating_point and w.dtype.is_floating_point:
            # where eager computed (part of) the value less precisely than the contract's output dtype (a float32
            # intermediate in a float64 epilogue, a bfloat16 reduction evtorch does in float32, a composite like
            # gelu that eager evaluates as one kernel), agreement is only to that precision
            coarse = max((d for d in (w.dtype, lowest) if d in TOLERANCES), key=lambda d: TOLERANCES[d][0],
                         default=dtype)
            if rtol is None and atol is None and TOLERANCES[coarse][0] > TOLERANCES[dtype][0]:
                r, a = TOLERANCES[coarse]
            # the contract casts eager's result to the output dtype (a float32 3e38 is inf in float16)
            w = w.to(dtype)
            h = None if h is None else h.to(dtype)
        assert_matches(g, w, hi=h, dtype=dtype, rtol=r, atol=a, what=f"output {i}", sign_of_zero=sign_of_zero)


def gemm_runner(A, B, fn, **kw):
    return evt.gemm(A, B, fn, backend="reference", **kw)


def check_gemm(fn: Callable, A: torch.Tensor, B: torch.Tensor, *, runner: Callable = gemm_runner, out_dtype=None,
               outputs=None, rtol=None, atol=None, **inputs):
    """``runner(A, B, fn, **inputs)`` (default: ``evt.gemm`` on the reference backend) against eager; returns
    the results."""
    extra = {}
    if out_dtype is not None:
        extra["out_dtype"] = out_dtype
    if outputs is not None:
        extra["outputs"] = outputs
    got = runner(A, B, fn, **extra, **inputs)
    acc = eager_acc(A, B)
    ties: list = []
    want, lowest = eager_with_precision(fn, acc, ties=ties, **inputs)
    hi = eager_hi(fn, acc, **inputs)
    ep = evt.api.get_epilogue(fn, tuple(acc.shape), acc.dtype, inputs, keep=outputs)
    try:
        compare_outputs(ep, got, want, hi, out_dtype=out_dtype or A.dtype, outputs=outputs, rtol=rtol, atol=atol,
                        lowest=lowest)
    except AssertionError as e:
        if ties[0]:
            raise EagerIllDefined(f"{e} (eager met a max / min of +0 and -0, whose winner depends on torch's "
                                  "kernel path)") from e
        raise
    return got


def check_reference(fn: Callable, acc: torch.Tensor, *, rtol=None, atol=None, sign_of_zero=False, **inputs):
    """Trace ``fn`` for this accumulator and inputs, run ``Epilogue.reference`` and compare with ``fn`` itself on
    the same (possibly inf/NaN-laden) accumulator. Returns the Epilogue."""
    ep = evt.trace(fn, acc=acc, **inputs)
    got = ep.reference(acc, **inputs)
    want, lowest = eager_with_precision(fn, acc, **inputs)
    hi = eager_hi(fn, acc, **inputs)
    compare_outputs(ep, got, want, hi, out_dtype=acc.dtype, rtol=rtol, atol=atol, lowest=lowest,
                    sign_of_zero=sign_of_zero)
    return ep


def ops_in(graph, op: str | None = None) -> list[str]:
    """Targets of the compute nodes of an IR graph (optionally only those equal to ``op``)."""
    return [n.target for n in graph.nodes if n.op == "compute" and (op is None or n.target == op)]


def count(graph, op: str, target=None) -> int:
    return len(graph.find(op, target))


def check_reduce_overhead_steps(eager_first: bool, steps: int = 5) -> None:
    """``evt.linear(x, W, gelu_tanh, b)`` (bf16, 1024x512x256: enough tiles for the TMA templates) trained under
    ``torch.compile(mode="reduce-overhead", fullgraph=True)`` (CUDA-graph trees: warm-up runs whose allocations
    come from the graph's pool, then recorded graphs), ``eager_first``: after one eager step on the default
    stream. Each step's output and gradients against the fp32 eager reference, the error relative to the
    largest value (bf16 sums). CUDA only; the caller sets up the knobs (EVTORCH_AUTOTUNE)."""
    import torch.nn.functional as F

    torch._dynamo.reset()
    torch.manual_seed(0)
    M, N, K = 1024, 512, 256
    x = (torch.randn(M, K, device="cuda") * 0.5).bfloat16().requires_grad_()
    W = (torch.randn(N, K, device="cuda") * K ** -0.5).bfloat16().requires_grad_()
    b = (torch.randn(N, device="cuda") * 0.1).bfloat16().requires_grad_()

    def gelu(y):
        return F.gelu(y, approximate="tanh")
    if eager_first:
        y = evt.linear(x, W, gelu, b)
        torch.autograd.grad(y.float().sum(), (x, W, b))
    step = torch.compile(lambda x, W, b: evt.linear(x, W, gelu, b), mode="reduce-overhead", fullgraph=True)
    leaves32 = [t.detach().float().requires_grad_() for t in (x, W, b)]
    for i in range(steps):
        gy = torch.randn(M, N, device="cuda").bfloat16()
        y = step(x, W, b)
        grads = torch.autograd.grad(y, (x, W, b), gy)
        y32 = gelu(F.linear(*leaves32))
        want = torch.autograd.grad(y32, leaves32, gy.float())
        for name, g, w in zip(("y", "dx", "dW", "db"), (y, *grads), (y32.detach(), *want)):
            err = float((g.float() - w).abs().max() / w.abs().max())
            assert err < 2e-2, f"step {i} {name}: max error {err:.2e} of the largest |value|"
        del y, grads

"""Every registry op against eager PyTorch, on random data and on edge values (0, -0, negatives, large, inf, NaN).

The op tests are driven by the registry (``evtorch.ops.REGISTRY``): each op is reached through every spelling the
registry declares for it (``torch_fns``: torch.* / F.* callables; ``methods``: Tensor methods and operators),
with every operand arrangement eager accepts (acc with an aux tensor, both orders, Python numbers on either
side, runtime scalar inputs, integer tensors where the op takes them). A newly declared op is tested without
touching this file; ops that need special operands (booleans, a condition, a constant exponent, a dtype) get
them from their traits. Explicit spelling tables below pin down how user code reaches each op.
"""
from __future__ import annotations

import math
import operator

import pytest
import torch
import torch.nn.functional as F

import evtorch as evt
import evtorch.frontend.proxy
from evtorch.ops import REGISTRY
from evtorch.ops.registry import BOOL_ONLY, CAST, FLOAT_ONLY, REDUCTION

from helpers import check_gemm, check_reference, operands, ops_in, rand, rand_int

M, N, K = 7, 13, 5

ELEMENTWISE = sorted(n for n, op in REGISTRY.ops.items() if not op.has(REDUCTION))
#: ops user code can reach; the others (fma) are introduced by passes and tested through them (test_fma_*)
SPELLED = [n for n in ELEMENTWISE if REGISTRY[n].torch_fns or REGISTRY[n].methods or REGISTRY[n].has(CAST)]

#: Python operator functions for dunder method names: ``operator.add(2.5, acc)`` reaches ``acc.__radd__``
OPERATORS = {"__add__": operator.add, "__sub__": operator.sub, "__mul__": operator.mul,
             "__truediv__": operator.truediv, "__neg__": operator.neg, "__abs__": abs, "__pow__": operator.pow,
             "__lt__": operator.lt, "__le__": operator.le, "__gt__": operator.gt, "__ge__": operator.ge,
             "__eq__": operator.eq, "__ne__": operator.ne, "__and__": operator.and_, "__or__": operator.or_,
             "__invert__": operator.invert}

#: non-default attribute values each op is also checked with (attributes are compile-time constants)
ATTR_VARIANTS = {
    "add": [{"alpha": 2}, {"alpha": -0.5}],
    "sub": [{"alpha": 3}],
    "leaky_relu": [{"negative_slope": 0.2}, {"negative_slope": 1.5}],
    "gelu": [{"approximate": "tanh"}],
    "softplus": [{"beta": 2.0}, {"beta": 0.5, "threshold": 5.0}],
    "elu": [{"alpha": 0.5}],
}
POW_EXPONENTS = (2, 3, 4, -1, -2, 0.5, -0.5, 0, 1, 2.5, -1.5, 1 / 3)
CAST_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32, torch.int64, torch.int8,
               torch.uint8, torch.bool)


def spellings(op):
    """(label, call) for every way user code reaches ``op``; ``call(*operand_values, **attrs)``."""
    out = []
    for f in op.torch_fns:
        mod = getattr(f, "__module__", "") or ""
        prefix = "F" if "functional" in mod else "torch"
        if f in (torch.max, torch.min):
            # torch.max(x, number) is the (values, indices) reduction overload, refused on purpose (test_errors)
            out.append((f"torch.{f.__name__}", lambda *a, _f=f, **k: _f(*a, **k) if all(
                isinstance(v, (torch.Tensor, evt.frontend.proxy.TracedTensor)) for v in a) else _refuse()))
            continue
        out.append((f"{prefix}.{f.__name__}", lambda *a, _f=f, **k: _f(*a, **k)))
    for m in op.methods:
        if m.startswith("__"):
            out.append((m, lambda *a, _o=OPERATORS[m], **k: _o(*a, **k)))
        else:
            i = op.operands.index(op.method_self) if op.method_self else 0
            out.append((f".{m}()", lambda *a, _m=m, _i=i, **k: getattr(a[_i], _m)(*(a[:_i] + a[_i + 1:]), **k)))
    return out


def _refuse():
    raise TypeError("not part of this op's contract")


def _arrangements(op, x, y, z):
    """Operand tuples for ``op``; names refer to epilogue locals (acc, C, D, alpha, Ci)."""
    if op.name == "where":
        return [("acc > C", "acc", "C"), ("acc > C", "acc", 0.5), ("acc > C", -1.0, "acc"), ("acc > 0", "C", "acc"),
                ("acc > C", "alpha", "acc"), ("acc > C", "acc", "Ci")]
    if op.name == "clamp":
        return [("acc", -1.0, 2.0), ("acc", None, 0.5), ("acc", -0.5, None), ("acc", "C", None), ("acc", None, "C"),
                ("acc", "C", "D"), ("acc", "alpha", None), ("acc", 1.0, -1.0)]
    n = len(op.operands)
    if op.has(BOOL_ONLY):
        return [("acc > 0",) * 1] if n == 1 else [("acc > 0", "C < 0.5"), ("C < 0.5", "acc >= 1")]
    if n == 1:
        base = [("acc",), ("C",)]
        if not op.has(FLOAT_ONLY):
            base.append(("Ci",))
        return base
    if n == 2:
        pairs = [("acc", "C"), ("C", "acc"), ("acc", 2.5), (2.5, "acc"), ("acc", 0), (-0.5, "acc"), ("acc", "alpha"),
                 ("alpha", "acc"), ("acc", "acc")]
        if not op.has(FLOAT_ONLY):
            pairs += [("acc", "Ci"), ("Ci", "acc"), ("Ci", "Ci"), ("Ci", 3)]
        return pairs
    return [("acc",) * n, ("acc", "C", "D")[:n]]


def _value(name, env):
    if isinstance(name, str):
        return eval(name, {"torch": torch}, env)  # noqa: S307  (test-local expressions over the epilogue's locals)
    return name


def make_epilogue(call, operand_names, attrs):
    """An epilogue ``fn(acc, C, D, alpha, Ci)`` applying ``call`` to the named operands."""
    def fn(acc, C, D, alpha, Ci):
        env = {"acc": acc, "C": C, "D": D, "alpha": alpha, "Ci": Ci}
        return call(*[_value(v, env) for v in operand_names], **attrs)
    return fn


def op_inputs(dtype, *, edge, seed=0):
    return dict(C=rand((M, N), dtype, seed=seed + 10, edge=edge), D=rand((M, N), dtype, seed=seed + 11, edge=edge),
                alpha=-1.25, Ci=rand_int((M, N), -3, 4, seed=seed + 12))


def cases(op):
    """(label, epilogue) for every spelling x arrangement x attribute variant of an elementwise op."""
    if op.name == "cast":
        spells = [(f".to({d})", (lambda x, _d=d: x.to(_d))) for d in CAST_DTYPES]
        spells += [(".float()", lambda x: x.float()), (".half()", lambda x: x.half()),
                   (".bfloat16()", lambda x: x.bfloat16()), (".double()", lambda x: x.double()),
                   (".int()", lambda x: x.int()), (".long()", lambda x: x.long()), (".bool()", lambda x: x.bool()),
                   (".to(dtype=)", lambda x: x.to(dtype=torch.float16)), (".type_as()", lambda x: x.type_as(x.half()))]
        return [(f"{lbl}[{a}]", make_epilogue(c, (a,), {})) for lbl, c in spells for a in ("acc", "C", "Ci")]
    out = []
    variants = [{}] + ATTR_VARIANTS.get(op.name, [])
    if op.name == "pow":
        variants = [{"exponent": e} for e in POW_EXPONENTS]
    for lbl, call in spellings(op):
        for attrs in variants:
            for arr in _arrangements(op, "acc", "C", "D"):
                if op.name == "pow":  # the exponent is positional in every spelling (x ** e, torch.pow(x, e))
                    e = attrs["exponent"]
                    fn = make_epilogue(lambda *a, _c=call, _e=e: _c(*a, _e), arr, {})
                    out.append((f"{lbl}{arr}**{e}", fn))
                elif attrs and lbl.startswith("__"):
                    continue  # operators take no attributes
                else:
                    out.append((f"{lbl}{arr}{attrs or ''}", make_epilogue(call, arr, attrs)))
    return out


def _run_cases(op, run):
    ran, refused = [], []
    for label, fn in cases(op):
        acc_probe = torch.zeros(2, 3)
        try:  # only arrangements eager PyTorch accepts are part of the contract
            fn(acc_probe, C=torch.zeros(2, 3), D=torch.zeros(2, 3), alpha=-1.25, Ci=torch.zeros(2, 3, dtype=torch.long))
        except (TypeError, RuntimeError, AttributeError):
            refused.append(label)
            continue
        try:
            run(fn)
        except Exception as e:  # noqa: BLE001
            raise AssertionError(f"{op.name} spelled {label}: {type(e).__name__}: {e}") from e
        ran.append(label)
    return ran, refused


@pytest.mark.parametrize("name", SPELLED)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_op_edge_values_match_eager(name, dtype):
    """Each elementwise op, all spellings, on an accumulator and aux inputs full of edge values."""
    op = REGISTRY[name]
    acc = rand((M, N), dtype, seed=1, edge=True)
    inputs = op_inputs(dtype, edge=True)
    # signed zeros must match too, except where torch itself leaves the choice to the kernel path
    signs = name not in ("maximum", "minimum", "clamp")
    ran, refused = _run_cases(op, lambda fn: check_reference(fn, acc, sign_of_zero=signs, **inputs))
    assert ran, f"no spelling of {name} ran (eager refused all of: {refused})"
    # every declared spelling must be exercised at least once
    for lbl, _ in spellings(op):
        assert any(r.startswith(lbl) for r in ran), f"{name}: spelling {lbl} never ran"


@pytest.mark.parametrize("name", SPELLED)
def test_op_through_gemm_matches_eager(name):
    """Each op once more through ``evt.gemm`` on random data: the traced IR names the op (or its decomposition)."""
    op = REGISTRY[name]
    A, B = operands(M, N, K, seed=3)
    inputs = op_inputs(torch.float32, edge=False, seed=5)
    seen_op = []

    def run(fn):
        check_gemm(fn, A, B, **inputs)
        ep = evt.api.get_epilogue(fn, (M, N), torch.float32, inputs)
        seen_op.append(name in ops_in(ep.traced))

    ran, _ = _run_cases(op, run)
    assert ran
    if op.decompose is None:
        assert any(seen_op), f"{name} never appeared as a node in the traced IR"
    else:
        assert not any(seen_op), f"composite {name} should be decomposed into primitives, not kept as one node"


def test_unspelled_ops_are_the_pass_introduced_ones():
    """An op without a user spelling must be one a pass introduces (and tested through that pass)."""
    assert set(ELEMENTWISE) - set(SPELLED) <= {"fma"}


def test_registry_covers_issue_minimum():
    """Every op of the issue's minimum list is declared (reductions included)."""
    required = ("add sub mul div neg abs pow eq ne lt le gt ge logical_and logical_or logical_not where relu "
                "leaky_relu gelu silu sigmoid tanh exp exp2 log log1p log2 sqrt rsqrt softplus hardswish hardsigmoid "
                "elu erf clamp maximum minimum square reciprocal sign floor ceil round cast sum amax amin mean "
                "logsumexp").split()
    missing = [r for r in required if r not in REGISTRY]
    assert not missing, missing


# ------------------------------------------------------------------------------------------ explicit spellings
def _aux(acc, C):
    return acc, C


SPELLINGS = [
    # (IR op expected in the traced graph, epilogue)
    ("add", lambda acc, C: acc + C), ("add", lambda acc, C: C + acc), ("add", lambda acc, C: torch.add(acc, C)),
    ("add", lambda acc, C: acc.add(C)), ("add", lambda acc, C: acc + 2), ("add", lambda acc, C: 2 + acc),
    ("add", lambda acc, C: acc + 2.5), ("add", lambda acc, C: 2.5 + acc), ("add", lambda acc, C: torch.add(acc, C, alpha=3)),
    ("sub", lambda acc, C: acc - C), ("sub", lambda acc, C: 1 - acc), ("sub", lambda acc, C: acc - 1.5),
    ("sub", lambda acc, C: torch.sub(acc, C)), ("sub", lambda acc, C: torch.subtract(C, acc)),
    ("sub", lambda acc, C: acc.sub(C, alpha=2)),
    ("mul", lambda acc, C: acc * C), ("mul", lambda acc, C: 3 * acc), ("mul", lambda acc, C: acc * 0.5),
    ("mul", lambda acc, C: torch.mul(acc, C)), ("mul", lambda acc, C: torch.multiply(acc, C)),
    ("mul", lambda acc, C: acc.mul(2.0)),
    ("div", lambda acc, C: acc / C), ("div", lambda acc, C: 1 / acc), ("div", lambda acc, C: acc / 4),
    ("div", lambda acc, C: torch.div(acc, C)), ("div", lambda acc, C: torch.true_divide(acc, 3)),
    ("div", lambda acc, C: acc.divide(C)),
    ("neg", lambda acc, C: -acc), ("neg", lambda acc, C: torch.neg(acc)), ("neg", lambda acc, C: acc.negative()),
    ("abs", lambda acc, C: abs(acc)), ("abs", lambda acc, C: torch.abs(acc)), ("abs", lambda acc, C: acc.absolute()),
    ("pow", lambda acc, C: acc ** 2), ("pow", lambda acc, C: torch.pow(acc, 3)), ("pow", lambda acc, C: acc.pow(0.5)),
    ("pow", lambda acc, C: acc ** -1.5),
    ("gt", lambda acc, C: acc > C), ("gt", lambda acc, C: 0 < acc), ("lt", lambda acc, C: acc < 0.5),
    ("lt", lambda acc, C: torch.less(acc, C)), ("le", lambda acc, C: acc <= C), ("ge", lambda acc, C: acc >= 1),
    ("ge", lambda acc, C: acc.greater_equal(C)), ("eq", lambda acc, C: acc == C), ("ne", lambda acc, C: acc != 0),
    ("logical_and", lambda acc, C: (acc > 0) & (C > 0)), ("logical_and", lambda acc, C: torch.logical_and(acc > 0, C > 0)),
    ("logical_or", lambda acc, C: (acc > 0) | (C > 0)), ("logical_or", lambda acc, C: (acc > 0).logical_or(C > 0)),
    ("logical_not", lambda acc, C: ~(acc > 0)), ("logical_not", lambda acc, C: torch.logical_not(acc > C)),
    ("where", lambda acc, C: torch.where(acc > 0, acc, C)), ("where", lambda acc, C: torch.where(acc > 0, acc, 0.0)),
    ("where", lambda acc, C: torch.where(acc > 0, 1.0, acc)), ("where", lambda acc, C: acc.where(acc > 0, C)),
    ("where", lambda acc, C: acc.where(C < 0, -1.0)),
    ("clamp", lambda acc, C: torch.clamp(acc, -1, 1)), ("clamp", lambda acc, C: torch.clip(acc, min=0.0)),
    ("clamp", lambda acc, C: acc.clamp(max=0.5)), ("clamp", lambda acc, C: acc.clip(-0.5, 0.5)),
    ("clamp", lambda acc, C: torch.clamp(acc, C)),
    ("maximum", lambda acc, C: torch.maximum(acc, C)), ("maximum", lambda acc, C: torch.max(acc, C)),
    ("maximum", lambda acc, C: acc.maximum(C)), ("minimum", lambda acc, C: torch.minimum(acc, C)),
    ("minimum", lambda acc, C: torch.min(C, acc)),
    ("relu", lambda acc, C: torch.relu(acc)), ("relu", lambda acc, C: F.relu(acc)), ("relu", lambda acc, C: acc.relu()),
    ("relu", lambda acc, C: F.relu(acc, inplace=False)),
    ("sigmoid", lambda acc, C: torch.sigmoid(acc)), ("sigmoid", lambda acc, C: F.sigmoid(acc)),
    ("sigmoid", lambda acc, C: acc.sigmoid()), ("tanh", lambda acc, C: F.tanh(acc)), ("tanh", lambda acc, C: acc.tanh()),
    ("logsigmoid", lambda acc, C: F.logsigmoid(acc)),
    ("exp", lambda acc, C: acc.exp()), ("exp2", lambda acc, C: torch.exp2(acc)), ("log", lambda acc, C: torch.log(acc)),
    ("log1p", lambda acc, C: acc.log1p()), ("log2", lambda acc, C: acc.log2()), ("sqrt", lambda acc, C: acc.sqrt()),
    ("rsqrt", lambda acc, C: torch.rsqrt(acc)), ("erf", lambda acc, C: torch.erf(acc)),
    ("erf", lambda acc, C: torch.special.erf(acc)), ("sign", lambda acc, C: acc.sign()),
    ("floor", lambda acc, C: torch.floor(acc)), ("ceil", lambda acc, C: acc.ceil()), ("round", lambda acc, C: acc.round()),
    # composites: traced into primitives
    ("mul", lambda acc, C: torch.square(acc)), ("mul", lambda acc, C: acc.square()),
    ("div", lambda acc, C: torch.reciprocal(acc)), ("div", lambda acc, C: acc.reciprocal()),
    ("where", lambda acc, C: F.leaky_relu(acc)), ("where", lambda acc, C: F.leaky_relu(acc, 0.2)),
    ("where", lambda acc, C: F.leaky_relu(acc, negative_slope=0.3)),
    ("erf", lambda acc, C: F.gelu(acc)), ("tanh", lambda acc, C: F.gelu(acc, approximate="tanh")),
    ("sigmoid", lambda acc, C: F.silu(acc)), ("log1p", lambda acc, C: F.softplus(acc)),
    ("log1p", lambda acc, C: F.softplus(acc, beta=2, threshold=10)), ("clamp", lambda acc, C: F.hardswish(acc)),
    ("clamp", lambda acc, C: F.hardsigmoid(acc)), ("exp", lambda acc, C: F.elu(acc)),
    ("exp", lambda acc, C: F.elu(acc, alpha=0.7)),
    # casts
    ("cast", lambda acc, C: acc.half()), ("cast", lambda acc, C: acc.bfloat16()), ("cast", lambda acc, C: acc.double()),
    ("cast", lambda acc, C: acc.to(torch.float16)), ("cast", lambda acc, C: acc.to(dtype=torch.bfloat16)),
    ("cast", lambda acc, C: acc.to(torch.int32)), ("cast", lambda acc, C: (acc > 0).float()),
    ("cast", lambda acc, C: acc.type_as(C.half())),
]


@pytest.mark.parametrize("expected, fn", SPELLINGS, ids=[f"{i}-{e}" for i, (e, _) in enumerate(SPELLINGS)])
def test_spelling(expected, fn):
    """How user code spells an op decides nothing but the op: the traced IR holds ``expected``, values match."""
    A, B = operands(M, N, K, seed=11)
    C = rand((M, N), seed=12)
    check_gemm(fn, A, B, C=C)
    acc = rand((M, N), seed=13, edge=True)
    check_reference(fn, acc, C=rand((M, N), seed=14, edge=True))
    ep = evt.trace(fn, acc=evt.spec((M, N)), C=C)
    assert expected in ops_in(ep.traced), f"expected a {expected} node:\n{ep.traced}"


def test_attribute_spellings_normalise_to_one_node():
    """``F.leaky_relu(x, 0.2)`` and ``F.leaky_relu(x, negative_slope=0.2)`` are the same computation."""
    def fn(acc):
        return F.leaky_relu(acc, 0.2), F.leaky_relu(acc, negative_slope=0.2), torch.pow(acc, 2), acc ** 2

    ep = evt.trace(fn, acc=evt.spec((M, N)))
    outs = ep.graph.outputs
    assert outs[0].args[0] is outs[1].args[0]
    assert outs[2].args[0] is outs[3].args[0]


def test_scalar_inputs_in_python_arithmetic():
    """Runtime scalars take part in Python-level arithmetic exactly as numbers do in eager."""
    def fn(acc, alpha, beta, k):
        return acc * -alpha + abs(beta) * acc ** 2 + alpha ** 2 - (1 - beta) / alpha + k * acc + acc / (alpha * beta)

    A, B = operands(M, N, K, seed=21)
    check_gemm(fn, A, B, alpha=0.3, beta=-1.7, k=3)
    A64, B64 = operands(M, N, K, torch.float64, seed=21)
    check_gemm(fn, A64, B64, alpha=0.1, beta=-0.7, k=-2)  # float64: scalar arithmetic is not rounded to float32


def test_tensor_valued_constants():
    """``zeros_like`` / ``ones_like`` / ``full_like`` are tensors in eager: they work where torch wants tensors
    (``torch.maximum``) and promote like tensors."""
    def fn(acc, Ci, C):
        return torch.maximum(Ci, torch.zeros_like(Ci)), torch.minimum(acc, torch.full_like(acc, 0.5)), \
            torch.maximum(torch.zeros_like(acc), acc), torch.maximum(Ci, torch.full_like(acc, 0.5)), \
            torch.ones_like(acc, dtype=torch.float16) + C, torch.where(acc > 0, torch.ones_like(Ci), Ci), \
            (torch.zeros_like(acc, dtype=torch.int32) + 1) * acc

    A, B = operands(M, N, K, seed=33)
    check_gemm(fn, A, B, Ci=rand_int((M, N), -3, 3, seed=34), C=rand((M, N), torch.float16, seed=35))
    check_reference(fn, rand((M, N), seed=36, edge=True), Ci=rand_int((M, N), -3, 3, seed=34),
                    C=rand((M, N), torch.float16, seed=37, edge=True))


def test_integer_and_bool_dtypes_follow_eager_promotion():
    """Integer and bool values keep eager's promotion: int + int stays int, int * acc is float, bool outputs."""
    def fn(acc, Ci, Cj, mask):
        return Ci + Cj, Ci * 2, acc * Ci, (acc > 0) & mask, torch.where(mask, Ci, 0), Ci.float() / 2, torch.abs(-Ci)

    A, B = operands(M, N, K, seed=31)
    Ci, Cj = rand_int((M, N), -5, 5, seed=1), rand_int((M, N), -5, 5, seed=2, dtype=torch.int32)
    mask = rand((M, N), seed=3) > 0
    got = check_gemm(fn, A, B, Ci=Ci, Cj=Cj, mask=mask)
    assert [g.dtype for g in got] == [torch.int64, torch.int64, torch.float32, torch.bool, torch.int64,
                                      torch.float32, torch.int64]


@pytest.mark.interpreter
def test_bool_plus_bool_is_a_logical_or():
    """torch's bool + bool is bool and True + True is True; the kernel's 1-bit add wrapped it to False (every
    element of m + m came out False on the triton backend, found 2026-11-29). Also through arithmetic and sums."""
    def fn(acc, m):
        return m + m, ((acc > 0) + m) * 1.0, (m + (acc > 0)).sum(1), m + True

    A, B = operands(M, N, K, seed=51)
    m = rand((M, N), seed=52) > 0
    for backend in ("reference", "triton"):
        got = check_gemm(fn, A, B, m=m, runner=lambda A, B, fn, **kw: evt.gemm(A, B, fn, backend=backend, **kw))
        assert got[0].dtype == torch.bool and torch.equal(got[0].cpu(), m.cpu()) and got[3].all(), backend


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_inputs_promote_like_eager(dtype):
    """A half/bfloat16 aux input meets the fp32 accumulator in fp32; outputs come back in A's dtype."""
    def fn(acc, C, v):
        return acc * C + v, (C * 2).float(), (acc + C).sum(1)

    A, B = operands(M, N, K, dtype, seed=41)
    got = check_gemm(fn, A, B, C=rand((M, N), dtype, seed=42), v=rand((N,), dtype, seed=43))
    assert got[0].dtype == dtype and got[2].dtype == torch.float32


@pytest.mark.parametrize("dtype, ulp", [(torch.float16, 2 ** -10), (torch.bfloat16, 2 ** -7)])
def test_composites_on_low_precision_round_once(dtype, ulp):
    """Eager evaluates F.gelu(x16) & co. in float32 and rounds once; so must the decomposition (rounding after
    every primitive would be several ulps off)."""
    composites = sorted(n for n, op in REGISTRY.ops.items() if op.decompose is not None and op.has(FLOAT_ONLY))
    assert composites
    x = rand((64, 32), dtype, seed=91, scale=3.0)
    for name in composites:
        spelled = REGISTRY[name].torch_fns[0]
        fn = lambda acc, C, _f=spelled: (_f(C), _f(C).float() * 2)  # noqa: E731
        got = evt.trace(fn, acc=evt.spec(x.shape), C=x).reference(torch.zeros(x.shape), out_dtype=dtype, C=x)
        want = spelled(x)
        assert got[0].dtype == dtype
        err = ((got[0].double() - want.double()).abs() / want.double().abs().clamp_min(1e-3)).max().item()
        assert err <= 1.01 * ulp, f"{name} on {dtype}: {err / ulp:.1f} ulp from eager"
        torch.testing.assert_close(got[1], (want.float() * 2).to(dtype), rtol=2.01 * ulp, atol=1e-3)


def test_out_dtype():
    A, B = operands(M, N, K, seed=51)
    fn = lambda acc: (torch.relu(acc), acc.sum(0))  # noqa: E731
    got = check_gemm(fn, A, B, out_dtype=torch.float16)
    assert got[0].dtype == torch.float16 and got[1].dtype == torch.float32


def test_float64_computes_in_float64():
    """float64 A and B: accumulate, compute and reduce in float64 (precision a float32 path would lose)."""
    def fn(acc, C, alpha):
        z = torch.tanh(alpha * acc + C) + 1e-9 * acc
        return z, z.sum(1), torch.logsumexp(z, 0), (z - 1).mean()

    A, B = operands(M, N, K, torch.float64, seed=61)
    C = rand((M, N), torch.float64, seed=62)
    got = check_gemm(fn, A, B, C=C, alpha=0.7, rtol=1e-13, atol=1e-13)
    assert all(g.dtype == torch.float64 for g in got)
    ep = evt.trace(fn, acc=evt.spec((M, N), torch.float64), C=C, alpha=0.7)
    assert all(n.dtype == torch.float64 for n in ep.graph.nodes if n.op in ("compute", "reduce", "acc"))
    assert [o.dtype for o in ep.outputs] == [torch.float64] * 4


def test_fma_reference_matches_mul_add():
    """fma has no user spelling (the fusion pass introduces it): its reference is a * b + c, edge values too."""
    fma = REGISTRY["fma"]
    a, b, c = (rand((M, N), seed=s, edge=True) for s in (1, 2, 3))
    got, want = fma.torch_ref(a, b, c), a * b + c
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got[~got.isnan()], want[~want.isnan()])


def test_fused_fma_matches_eager_on_edge_values():
    def fn(acc, C, D, alpha):
        return alpha * acc + C, acc * C + D, D + (C - 1) * acc

    acc = rand((M, N), seed=71, edge=True)
    ep = check_reference(fn, acc, C=rand((M, N), seed=72, edge=True), D=rand((M, N), seed=73, edge=True), alpha=1.5)
    assert ops_in(ep.graph).count("fma") == 3


def test_comparisons_with_nan_and_inf():
    """NaN compares unequal to everything (ne is True), inf equals inf; where picks by the mask."""
    def fn(acc, C):
        return acc == C, acc != C, acc < C, torch.where(acc != acc, -7.0, acc), torch.maximum(acc, C), \
            torch.minimum(acc, C), torch.clamp(acc, -1.0, 1.0)

    acc = torch.tensor([[math.nan, math.inf, -math.inf, 0.0, -0.0, 1.0]])
    C = torch.tensor([[math.nan, math.inf, 1.0, -0.0, 0.0, math.nan]])
    check_reference(fn, acc, C=C)


def test_register_op_is_traced_and_tested_like_a_builtin():
    """A user-registered op (register_op) joins the registry: eager and traced use agree."""
    import triton
    import triton.language as tl

    @triton.jit
    def _softsign_tl(x):
        return x / (1.0 + tl.abs(x))

    name = "softsign_test_op"
    call = evt.register_op(name, lambda x: x / (1 + torch.abs(x)), _softsign_tl)
    try:
        def fn(acc, C):
            return call(acc) + call(C), call(acc).sum(1)

        A, B = operands(M, N, K, seed=81)
        check_gemm(fn, A, B, C=rand((M, N), seed=82))
        check_reference(fn, rand((M, N), seed=83, edge=True), C=rand((M, N), seed=84, edge=True))
        ep = evt.trace(fn, acc=evt.spec((M, N)), C=rand((M, N)))
        assert name in ops_in(ep.graph)
        with pytest.raises(evt.EpilogueError, match=name):
            evt.register_op(name, lambda x: x, _softsign_tl)
    finally:  # leave the registry as other tests expect it
        REGISTRY.ops.pop(name, None)

"""Elementwise ops: one ``define`` each.

Triton emissions receive operands already converted to the compute dtype (``float32``, or ``float64`` when
the epilogue computes in fp64) except for ops with the ``bool_only``/``compare``/``cast`` traits, which see
operands in their own dtype. Composite ops (``decompose``) are written with the public torch API, so the
tracer turns them into primitives and codegen, the reference executor and autodiff need nothing new.

Derivatives are written in plain torch: ``derivative(grad, *operands, out=out, **attrs)`` returns one
gradient per operand (``None`` where the operand is not differentiable). The same rule runs on real
tensors (reference backward, tested against torch autograd) and on traced values (generated backward).
"""
from __future__ import annotations

import functools
import math
import operator

import torch
import torch.nn.functional as F

from .registry import BOOL_ONLY, CAST, COMMUTATIVE, COMPARE, FLOAT_ONLY, define


def _sum_to(g, like):
    """Gradients of broadcast operands are reduced by the autodiff engine; rules return full-size grads."""
    return g


# ----------------------------------------------------------------------------------------------- arithmetic
# References of ops a Python-number scalar input can reach (``-alpha``, ``abs(alpha)``, ``alpha ** 2``) use the
# operators, not ``torch.neg``/``torch.abs``/``torch.pow``: eager evaluates those on the number itself.
def _add(input, other, *, alpha=1): ...
def _binary(input, other): ...
def _unary(input): ...


define("add", _add, operands=("input", "other"),
       torch_ref=lambda a, b, alpha=1: torch.add(a, b, alpha=alpha) if alpha != 1 else a + b,
       triton=lambda alpha=1: "({0} + {1})" if alpha == 1 else "({0} + {alpha} * {1})",  # an int alpha stays int
       derivative=lambda g, a, b, out, alpha=1: (g, g * alpha if alpha != 1 else g),
       torch_fns=(torch.add,), methods=("add", "__add__"), traits=frozenset({COMMUTATIVE}))
define("sub", _add, operands=("input", "other"),
       torch_ref=lambda a, b, alpha=1: torch.sub(a, b, alpha=alpha) if alpha != 1 else a - b,
       triton=lambda alpha=1: "({0} - {1})" if alpha == 1 else "({0} - {alpha} * {1})",
       derivative=lambda g, a, b, out, alpha=1: (g, -g * alpha if alpha != 1 else -g),
       torch_fns=(torch.sub, torch.subtract), methods=("sub", "subtract", "__sub__"))
define("mul", _binary, operands=("input", "other"), torch_ref=lambda a, b: a * b, triton="({0} * {1})",
       derivative=lambda g, a, b, out: (g * b, g * a),
       torch_fns=(torch.mul, torch.multiply), methods=("mul", "multiply", "__mul__"),
       traits=frozenset({COMMUTATIVE}))
define("div", _binary, operands=("input", "other"), torch_ref=lambda a, b: a / b, triton="({0} / {1})",
       derivative=lambda g, a, b, out: (g / b, -g * out / b),
       torch_fns=(torch.div, torch.divide, torch.true_divide), methods=("div", "divide", "__truediv__"))
define("neg", _unary, torch_ref=lambda x: -x, triton="tlmath.neg({0})", derivative=lambda g, x, out: (-g,),
       torch_fns=(torch.neg, torch.negative), methods=("neg", "negative", "__neg__"))
def _abs_ref(x):
    # eager has no abs kernel for bool ("abs_cpu" not implemented for 'Bool'), but the meta tensors tracing
    # evaluates on accept it: refused here, at trace time, instead of by the reference executor's kernel (a raw
    # NotImplementedError) while the triton backend returned the mask
    if isinstance(x, torch.Tensor) and x.dtype == torch.bool:
        raise TypeError("abs is not defined on bool tensors in PyTorch; use the mask itself or x.float().abs()")
    return abs(x)


define("abs", _unary, torch_ref=_abs_ref, triton="tl.abs({0})",
       derivative=lambda g, x, out: (g * torch.sign(x),),
       torch_fns=(torch.abs, torch.absolute), methods=("abs", "absolute", "__abs__"))


# ``unrounded``: set by the tracer only, where it rounded a 16-bit operand's exponent as eager does
# (frontend/tracer.py, ``_eager_exponent``); eager's backward takes the exponent as given
def _pow(input, exponent, *, unrounded=None): ...


def _pow_derivative(g, x, out, exponent, unrounded=None):
    """torch's ``pow_backward``: ``grad * (p * x.pow(p - 1))`` with ``p`` the exponent as given (a 16-bit ``x``
    rounds it only inside ``pow``); ``x ** 0`` has a zero gradient (``0 * x ** -1`` was NaN at x = 0, found by a
    probe 2026-11-29)."""
    p = exponent if unrounded is None else unrounded
    if p == 0:
        return (torch.zeros_like(g),)
    if p == 1:
        return (g,)
    return (g * (p * torch.pow(x, p - 1)),)


define("pow", _pow, operands=("input",), torch_ref=lambda x, exponent, unrounded=None: x ** exponent,
       triton=lambda exponent, unrounded=None: _pow_emission(exponent),
       triton_gpu=lambda exponent, unrounded=None: _pow_gpu_emission(exponent), triton_gpu_computes=("float64",),
       derivative=_pow_derivative,
       torch_fns=(torch.pow,), methods=("pow", "__pow__"), traits=frozenset({FLOAT_ONLY}),
       doc="x ** c for a constant exponent c; small integer exponents become multiplications")


def _power_by_squaring(p: int) -> str:
    """``{0} ** p`` as products of repeated squares (x^13 = x^8 * x^4 * x)."""
    square, terms = "{0}", []
    while p:
        if p & 1:
            terms.append(square)
        p >>= 1
        if p:
            square = f"({square} * {square})"
    return "(" + " * ".join(terms) + ")"


# the exponents ATen's pow kernels compute without pow (a product, a reciprocal, sqrt, rsqrt): evtorch computes them
# the same way on every device; every other exponent of a float64 value is libdevice's pow on a GPU (``pow_gpu``,
# the ``triton_gpu`` form: eager's bits there), of a float32 or 16-bit one float64 arithmetic rounded once
EAGER_POW_SPECIAL = frozenset({0, 1, 2, 3, -1, -2, 0.5, -0.5})


def _pow_emission(exponent) -> str:
    """The portable emission of ``x ** exponent``, within an ulp of eager's pow for float32 and 16-bit values."""
    if exponent == 0:
        return "tlmath.ones_like({0})"
    if exponent in (1, 2, 3):
        return "(" + " * ".join(["{0}"] * int(exponent)) + ")"
    if exponent in (-1, -2):
        return "(1.0 / (" + " * ".join(["{0}"] * int(-exponent)) + "))"
    if exponent == 0.5:
        return "tl.sqrt({0})"
    if exponent == -0.5:
        return "tlmath.rsqrt({0})"
    if float(exponent).is_integer() and 4 <= abs(exponent) <= 32:
        # by squaring in float64, rounded once: exp2(p * log2|x|) took up to 14 ulps (3.0 ** 5 gave 242.99997,
        # found 2026-11-29), float32 squares up to a few; negative bases, signed zeros and infinities come out as
        # the products give them, and a float32 result that overflows is inf as eager's. A negative exponent is the
        # reciprocal of the float64 power (1 / (+-0.0) is +-inf, 1 / inf is 0, as eager's powf)
        power = _power_by_squaring(int(abs(exponent))).replace("{0}", "{0}.to(tl.float64)")
        return f"({power if exponent > 0 else f'(1.0 / {power})'}).to({{0}}.dtype)"
    # an integer exponent keeps negative bases (x ** 35 of a negative x is negative, not NaN): powf's PARITY
    parity = (1 if int(exponent) % 2 else 2) if float(exponent).is_integer() else 0
    return f"tlmath.powf({{0}}, {float(exponent)!r}, {parity})"


def _pow_gpu_emission(exponent) -> str | None:
    """The exact GPU form of ``x ** exponent`` (float64 computations: ``triton_gpu_computes``): eager's pow
    (libdevice) where eager calls it, else None (the portable emission already computes as eager does)."""
    return None if exponent in EAGER_POW_SPECIAL else f"tlmath.pow_gpu({{0}}, {float(exponent)!r})"


define("square", _unary, decompose=lambda x: x * x, torch_fns=(torch.square,), methods=("square",))
define("reciprocal", _unary, decompose=lambda x: 1.0 / x,
       torch_fns=(torch.reciprocal,), methods=("reciprocal",), traits=frozenset({FLOAT_ONLY}))
define("fma", lambda a, b, c: None, operands=("a", "b", "c"), torch_ref=lambda a, b, c: a * b + c,
       triton="tl.fma({0}, {1}, {2})", derivative=lambda g, a, b, c, out: (g * b, g * a, g),
       doc="a * b + c in one instruction; introduced by the fusion pass, not by user code")


# ----------------------------------------------------------------------------------------------- compare/logic
def _cmp(name, fn, sym, methods, aliases=()):
    # the reference is the Python operator, not ``fn``: ``alpha < acc`` with a number-valued scalar input is
    # reflected to ``acc > alpha`` as in eager (``torch.lt(number, tensor)`` does not exist)
    pyop = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
            ">=": operator.ge}[sym]
    define(name, _binary, operands=("input", "other"), torch_ref=pyop, triton=f"({{0}} {sym} {{1}})",
           derivative=lambda g, a, b, out: (None, None), torch_fns=(fn,) + tuple(aliases), methods=methods,
           traits=frozenset({COMPARE}))


_cmp("eq", torch.eq, "==", ("eq", "__eq__"))
_cmp("ne", torch.ne, "!=", ("ne", "not_equal", "__ne__"), (torch.not_equal,))
_cmp("lt", torch.lt, "<", ("lt", "less", "__lt__"), (torch.less,))
_cmp("le", torch.le, "<=", ("le", "less_equal", "__le__"), (torch.less_equal,))
_cmp("gt", torch.gt, ">", ("gt", "greater", "__gt__"), (torch.greater,))
_cmp("ge", torch.ge, ">=", ("ge", "greater_equal", "__ge__"), (torch.greater_equal,))

define("logical_and", _binary, operands=("input", "other"), torch_ref=lambda a, b: a & b, triton="({0} & {1})",
       derivative=lambda g, a, b, out: (None, None), torch_fns=(torch.logical_and, torch.bitwise_and),
       methods=("logical_and", "__and__", "bitwise_and"), traits=frozenset({BOOL_ONLY, COMMUTATIVE}))
define("logical_or", _binary, operands=("input", "other"), torch_ref=lambda a, b: a | b, triton="({0} | {1})",
       derivative=lambda g, a, b, out: (None, None), torch_fns=(torch.logical_or, torch.bitwise_or),
       methods=("logical_or", "__or__", "bitwise_or"), traits=frozenset({BOOL_ONLY, COMMUTATIVE}))
define("logical_not", _unary, torch_ref=lambda a: ~a, triton="({0} == 0)",
       derivative=lambda g, a, out: (None,), torch_fns=(torch.logical_not, torch.bitwise_not),
       methods=("logical_not", "__invert__", "bitwise_not"), traits=frozenset({BOOL_ONLY}))


def _where(condition, input, other): ...


define("where", _where, operands=("condition", "input", "other"),
       torch_ref=torch.where, triton="tl.where({0}, {1}, {2})",
       derivative=lambda g, c, a, b, out: (None, torch.where(c, g, 0.0), torch.where(c, 0.0, g)),
       torch_fns=(torch.where,), methods=("where",), method_self="input")


def _clamp(input, min=None, max=None): ...


def _clamp_ref(x, lo, hi):
    # The IR spells a missing bound as an infinite constant (codegen wants a value). An infinite bound clamps
    # nothing, so it is dropped again here: ``torch.clamp(x, C)`` then stays the (tensor, tensor) overload
    # instead of becoming an invalid (tensor, number) mix, and integer x stays integer, as in eager.
    if isinstance(lo, float) and lo == -math.inf:
        lo = None
    if isinstance(hi, float) and hi == math.inf:
        hi = None
    if lo is None and hi is None:
        return x
    return torch.clamp(x, lo, hi)


def _clamp_derivative(g, x, lo, hi):
    # torch's clamp_backward_min_max: where lo > hi every element is hi, so hi takes the gradient and lo none
    # (x < lo and x > hi can both hold there). A missing max is the constant +inf: min's gradient is then
    # clamp_min's, x < lo alone (lo < inf would drop a +inf lo's). The masks are combined by nested selects, not
    # & / |: Triton's interpreter cannot combine a tile's mask with a 0-d input's
    def select(c, a, b):  # two constant bounds compare to a Python bool
        return (a if c else b) if isinstance(c, bool) else torch.where(c, a, b)

    d_lo = torch.where(x < lo, g, 0.0)
    if not (isinstance(hi, float) and hi == math.inf):
        d_lo = select(lo < hi, d_lo, 0.0)
    return (torch.where((x >= lo) & (x <= hi), g, 0.0), d_lo, torch.where(x > hi, g, select(hi < lo, g, 0.0)))


define("clamp", _clamp, operands=("input", "min", "max"),
       torch_ref=lambda x, lo, hi: _clamp_ref(x, lo, hi),
       triton="tlmath.clamp({0}, {1}, {2})",
       derivative=lambda g, x, lo, hi, out: _clamp_derivative(g, x, lo, hi),
       torch_fns=(torch.clamp, torch.clip), methods=("clamp", "clip"),
       doc="min/max may be numbers, tensors or None (None becomes -inf/+inf)")
# maximum / minimum: torch's max_min_backward, NaN operands included (a NaN on either side gives both g). Not
# commutative for CSE: on a tie eager returns the first operand, so maximum(0.0, -0.0) and maximum(-0.0, 0.0)
# differ in the sign of the zero (CSE merged them, found 2026-11-29)
define("maximum", _binary, operands=("input", "other"), torch_ref=torch.maximum, triton="tlmath.maximum({0}, {1})",
       derivative=lambda g, a, b, out: (torch.where(a < b, 0.0, torch.where(a == b, g * 0.5, g)),
                                         torch.where(a > b, 0.0, torch.where(a == b, g * 0.5, g))),
       torch_fns=(torch.maximum, torch.max), methods=("maximum",))
define("minimum", _binary, operands=("input", "other"), torch_ref=torch.minimum, triton="tlmath.minimum({0}, {1})",
       derivative=lambda g, a, b, out: (torch.where(a > b, 0.0, torch.where(a == b, g * 0.5, g)),
                                         torch.where(a < b, 0.0, torch.where(a == b, g * 0.5, g))),
       torch_fns=(torch.minimum, torch.min), methods=("minimum",))


# ----------------------------------------------------------------------------------------------- transcendental
def _float_unary(name, fn, triton, derivative, methods=None, extra_fns=(), triton_fast=None, fast_exact=False,
                 triton_gpu=None):
    define(name, _unary, torch_ref=fn, triton=triton, triton_fast=triton_fast, fast_exact=fast_exact,
           triton_gpu=triton_gpu,
           derivative=derivative,
           torch_fns=(fn,) + tuple(extra_fns), methods=methods or (name,), traits=frozenset({FLOAT_ONLY}))


_LN2 = math.log(2.0)
_float_unary("exp", torch.exp, "tl.exp({0})", lambda g, x, out: (g * out,))
_float_unary("exp2", torch.exp2, "tl.exp2({0})", lambda g, x, out: (g * out * _LN2,))
_float_unary("log", torch.log, "tl.log({0})", lambda g, x, out: (g / x,))
_float_unary("log2", torch.log2, "tl.log2({0})", lambda g, x, out: (g / (x * _LN2),))
_float_unary("log1p", torch.log1p, "tlmath.log1p({0})", lambda g, x, out: (g / (1.0 + x),))
_float_unary("sqrt", torch.sqrt, "tl.sqrt({0})", lambda g, x, out: (g * 0.5 / out,))
_float_unary("rsqrt", torch.rsqrt, "tlmath.rsqrt({0})", lambda g, x, out: (g * -0.5 * out / x,))
# tanh / sigmoid: accurate sequences (tlmath, interpreter-safe) and, for the fast-math path on a GPU
# (codegen/fastmath.py), the hardware approximations. Measured on an H200 (benchmarks/fastmath_check.py, 8M points in
# [-30, 30] against float64): tanh_approx max relative error 1.1e-5 (tlmath.tanh 6.1e-7), so only before a 16-bit
# rounding; sigmoid_approx 1.79e-6, as tlmath.sigmoid (1.75e-6), so wherever fast math is on (fast_exact). Where
# tanh stays accurate on a GPU (a float32 output, a sum), tlmath.tanh_gpu computes tlmath.tanh's bits with 6 fewer
# instructions (triton_gpu).
_float_unary("tanh", torch.tanh, "tlmath.tanh({0})", lambda g, x, out: (g * (1.0 - out * out),),
             extra_fns=(F.tanh,), triton_fast="tlmath.tanh_approx({0})", triton_gpu="tlmath.tanh_gpu({0})")
_float_unary("sigmoid", torch.sigmoid, "tlmath.sigmoid({0})", lambda g, x, out: (g * out * (1.0 - out),),
             extra_fns=(F.sigmoid,), triton_fast="tlmath.sigmoid_approx({0})", fast_exact=True)
# log(sigmoid(x)) as one op: F.logsigmoid, and what passes/stable.py turns log(sigmoid(x)) / log(1 - sigmoid(x)) into
# (no sigmoid rounding or underflow; on the GPU a series instead of a ~20-instruction log, see tlmath.logsigmoid)
define("logsigmoid", _unary, torch_ref=F.logsigmoid, triton="tlmath.logsigmoid({0})",
       triton_fast="tlmath.logsigmoid_approx({0})", fast_exact=True,
       derivative=lambda g, x, out: (g * torch.sigmoid(-x),),
       torch_fns=(F.logsigmoid,), traits=frozenset({FLOAT_ONLY}))
_float_unary("erf", torch.erf, "tlmath.erf({0})",
             lambda g, x, out: (g * (2.0 / math.sqrt(math.pi)) * torch.exp(-x * x),),
             extra_fns=(torch.special.erf,))
# piecewise-constant ops pass zeros, as eager's backward does, not g * 0.0: a NaN or inf g (sqrt's at a ceil's 0)
# would make that NaN (found 2026-11-29 by the random-DAG gradient test)
_float_unary("floor", torch.floor, "tl.floor({0})", lambda g, x, out: (torch.zeros_like(g),))
_float_unary("ceil", torch.ceil, "tl.ceil({0})", lambda g, x, out: (torch.zeros_like(g),))
_float_unary("round", torch.round, "tlmath.round_half_even({0})", lambda g, x, out: (torch.zeros_like(g),))
define("sign", _unary, torch_ref=torch.sign, triton="tlmath.sign({0})",
       derivative=lambda g, x, out: (torch.zeros_like(g),),
       torch_fns=(torch.sign,), methods=("sign",))


# ----------------------------------------------------------------------------------------------- activations
def _relu(input, inplace=False): ...


define("relu", _relu, torch_ref=torch.relu, triton="tlmath.relu({0})",
       # torch's threshold_backward: 0 where x <= 0, else g, so a NaN x passes g (x > 0 gave it 0, found by a
       # probe 2026-11-29)
       derivative=lambda g, x, out, inplace=False: (torch.where(x <= 0, 0.0, g),),
       torch_fns=(torch.relu, F.relu), methods=("relu",), traits=frozenset({FLOAT_ONLY}),
       doc="primitive (not maximum(x, 0)) so that its gradient at 0 is 0, as in torch")


def _leaky_relu(input, negative_slope=0.01, inplace=False): ...
def _gelu(input, approximate="none"): ...
def _silu(input, inplace=False): ...
def _softplus(input, beta=1.0, threshold=20.0): ...
def _hard(input, inplace=False): ...
def _elu(input, alpha=1.0, inplace=False): ...


_SQRT1_2 = 1.0 / math.sqrt(2.0)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)

define("leaky_relu", _leaky_relu,
       decompose=lambda x, negative_slope=0.01, inplace=False: torch.where(x > 0, x, x * negative_slope),
       derivative=lambda g, x, out, negative_slope=0.01, inplace=False: (
           torch.where(x > 0, g, g * negative_slope),),  # torch's leaky_relu_backward: one select
       torch_fns=(F.leaky_relu,), methods=(), traits=frozenset({FLOAT_ONLY}))
def _f32_product(a: float, b: float, x) -> float:
    """a * b as the compute dtype rounds it: torch's kernels fold such constant products in their opmath type."""
    if x.dtype == torch.float64:
        return a * b
    return float(torch.tensor(a, dtype=torch.float32) * torch.tensor(b, dtype=torch.float32))


def _gelu_derivative(g, x, out, approximate="none"):
    """torch's GeluBackward, operation for operation (aten's GeluKernel): one expression of x where differentiating
    the decomposition's primitives gives a longer one (the cube's product rule, tanh's 1 - t^2 on its own path):
    11% fewer instructions in the backward's epilogue-only pass (sm_90, offline), and the rounding steps eager's
    own backward takes."""
    if approximate == "tanh":
        x_sq = x * x
        t = torch.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * (x_sq * x)))
        left_derivative = 0.5 * (1.0 + t)
        inner_derivative = _SQRT_2_OVER_PI * (1.0 + _f32_product(3.0, 0.044715, x) * x_sq)
        right_derivative = 0.5 * x * (1.0 - t * t) * inner_derivative
        return (g * (left_derivative + right_derivative),)
    cdf = 0.5 * (1.0 + torch.erf(x * _SQRT1_2))
    pdf = torch.exp(-0.5 * x * x) * (2.0 / math.sqrt(math.pi) * _SQRT1_2 * 0.5)
    return (g * (cdf + x * pdf),)


def _silu_derivative(g, x, out, inplace=False):
    """torch's silu_backward: dy * s * (1 + x * (1 - s)), s = sigmoid(x)."""
    s = torch.sigmoid(x)
    return (g * s * (1.0 + x * (1.0 - s)),)


# gelu, silu, softplus, elu, hardswish, hardsigmoid (and leaky_relu, above) are composites with derivative rules of
# their own: the autodiff applies the rule to the composite's output instead of walking its decomposition
# (autodiff/reverse.py)
define("gelu", _gelu,
       decompose=lambda x, approximate="none": (
           0.5 * x * (1.0 + torch.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * (x * x * x))))
           if approximate == "tanh" else 0.5 * x * (1.0 + torch.erf(x * _SQRT1_2))),
       derivative=_gelu_derivative, torch_fns=(F.gelu,), traits=frozenset({FLOAT_ONLY}))
define("silu", _silu, decompose=lambda x, inplace=False: x * torch.sigmoid(x), derivative=_silu_derivative,
       torch_fns=(F.silu,), traits=frozenset({FLOAT_ONLY}))
def _softplus_derivative(g, x, out, beta=1.0, threshold=20.0):
    """torch's softplus_backward. The decomposition's own derivative is NaN above 88 / beta in float32: its
    untaken branch's exp overflows and inf / inf reaches the gradient through the where (0 * NaN)."""
    z = torch.exp(x * beta)
    return (torch.where(x * beta > threshold, g, g * z / (z + 1.0)),)


def _elu_derivative(g, x, out, alpha=1.0, inplace=False):
    """torch's elu_backward (on the input). The decomposition's expm1 divides 0 by log(1) = 0 at x = 0 in its
    untaken branch, a NaN gradient for an exact 0.0 (found 2026-11-29 by the random-DAG gradient test)."""
    return (torch.where(x <= 0, g * alpha * torch.exp(x), g),)  # torch's test: a NaN x takes g


define("softplus", _softplus,
       decompose=lambda x, beta=1.0, threshold=20.0: torch.where(
           x * beta > threshold, x, torch.log1p(torch.exp(x * beta)) / beta),
       derivative=_softplus_derivative, torch_fns=(F.softplus,), traits=frozenset({FLOAT_ONLY}))
# hardswish / hardsigmoid: torch's backward formulas, which pick g or 0 by ranges of x (the clamp's own rule would
# give 0 * g there, NaN for an infinite g, and its own choice at the kinks)
@functools.cache
def _hardswish_kinks() -> tuple[bool, bool]:
    """(whether x = -3 takes 0, whether x = 3 takes g), as the installed torch's ``hardswish_backward`` has them:
    torch 2.13's are ``x <= -3 -> 0``, ``x < 3 -> g * (x / 3 + 0.5)``, else g (evtorch had ``x < -3`` and
    ``x <= 3``: 1.5 and -0.5 at the kinks against eager's 1 and 0, found by a probe 2026-11-29); read off torch
    once, on the CPU, so that a torch whose kinks lie the other way is matched too."""
    g = torch.ops.aten.hardswish_backward(torch.ones(2), torch.tensor([-3.0, 3.0]))
    return bool(g[0] == 0), bool(g[1] == 1)


def _hardswish_derivative(g, x, out, inplace=False):
    low_closed, high_open = _hardswish_kinks()
    zero = (x <= -3.0) if low_closed else (x < -3.0)
    ramp = (x < 3.0) if high_open else (x <= 3.0)
    return (torch.where(zero, 0.0, torch.where(ramp, g * (x / 3.0 + 0.5), g)),)


define("hardswish", _hard, decompose=lambda x, inplace=False: x * torch.clamp(x + 3.0, 0.0, 6.0) / 6.0,
       derivative=_hardswish_derivative, torch_fns=(F.hardswish,), traits=frozenset({FLOAT_ONLY}))
# torch's hardsigmoid_backward multiplies by 1.0f / 6.0f in every dtype (CPU and CUDA): float64 gradients 3e-8 off
# 1/6, and float32 ones an ulp off g / 6; the rule takes the same constant, so gradients match eager's bit for bit
_ONE_SIXTH_F32 = float(torch.tensor(1.0 / 6.0, dtype=torch.float32))
# eager's own order, (x + 3) clamped, then / 6: x / 6 + 0.5 cancelled near -3 (25% off at -2.9999998, found
# 2026-11-29)
define("hardsigmoid", _hard, decompose=lambda x, inplace=False: torch.clamp(x + 3.0, 0.0, 6.0) / 6.0,
       derivative=lambda g, x, out, inplace=False: (torch.where((x > -3.0) & (x < 3.0), g * _ONE_SIXTH_F32, 0.0),),
       torch_fns=(F.hardsigmoid,), traits=frozenset({FLOAT_ONLY}))
def _expm1(x):
    """exp(x) - 1 without its cancellation near 0, from primitives (Kahan): (u - 1) * x / log(u) with u = exp(x)
    corrects the rounding of u; u == 1 means |x| is below rounding (exp(x) - 1 is x, keeping -0.0 as -0.0)."""
    u = torch.exp(x)
    d = u - 1.0
    return torch.where(u == 1.0, x, torch.where(d == -1.0, -1.0, torch.where(u == math.inf, u, d * x / torch.log(u))))


define("elu", _elu,
       decompose=lambda x, alpha=1.0, inplace=False: torch.where(x > 0, x, alpha * _expm1(x)),
       derivative=_elu_derivative, torch_fns=(F.elu,), traits=frozenset({FLOAT_ONLY}))


# ----------------------------------------------------------------------------------------------- casts
def _cast(input, dtype): ...


define("cast", _cast, torch_ref=lambda x, dtype: x.to(dtype), triton=None,
       derivative=lambda g, x, out, dtype: (g,), traits=frozenset({CAST}),
       doc="x.to(dtype), x.float(), x.half(), x.bfloat16(), x.double(); emission is done by the emitter")

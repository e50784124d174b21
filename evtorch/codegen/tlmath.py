"""Math helpers for generated kernels, built from Triton primitives only.

No libdevice and no inline asm: the CPU interpreter (``TRITON_INTERPRET=1``) must run every generated kernel,
so functions such as tanh, log1p and round-half-even are written here from exp/log/floor and friends, with
care for accuracy where the naive formula cancels (tanh and log1p near 0). The op registry's Triton
emissions call these as ``tlmath.<name>``; generated modules import this module under that name.

The exceptions are the functions at the end, in the fast-math section: the ``*_approx`` ones, hardware
approximations in inline PTX (``codegen/fastmath.py``), used only where every value they produce is rounded to 16
bits before it reaches an output (sigmoid's: wherever fast math is on, it measured as accurate as ``sigmoid``); and
the ``*_gpu`` ones, exact GPU forms (``OpDef.triton_gpu``): ``tanh_gpu`` (``tanh``'s bits in fewer instructions,
inline PTX) and ``pow_gpu`` (libdevice's pow, eager's own function on a GPU). Defining them is harmless
everywhere; they are *called* only from kernels compiled for an NVIDIA GPU of compute capability >= 7.5, never
under the interpreter.
"""
import triton
import triton.language as tl
from triton.language.extra import libdevice


@triton.jit
def sigmoid(x):
    # exp of a negative argument never overflows: 1/(1+e^-x) for x >= 0, e^x/(1+e^x) otherwise
    z = tl.exp(-tl.abs(x))
    return tl.where(x >= 0, 1.0 / (1.0 + z), z / (1.0 + z))


@triton.jit
def tanh(x):
    # |x| < 0.1: odd Taylor series (cancellation-free); below 0.55: (1 - e) / (1 + e) with e = exp(-2|x|);
    # above: 1 - 2e / (1 + e), which keeps the last bits near saturation where 1 + e would round to 1. The series
    # to x^7 leaves 2e-11 at 0.1, under float32's rounding; float64 takes it to x^15 (the next term 6e-21)
    ax = tl.abs(x)
    e = tl.exp(-2.0 * ax)
    x2 = ax * ax
    if x.dtype == tl.float64:
        small = x * (1.0 + x2 * (-1.0 / 3.0 + x2 * (2.0 / 15.0 + x2 * (-17.0 / 315.0 + x2 * (
            62.0 / 2835.0 + x2 * (-1382.0 / 155925.0 + x2 * (21844.0 / 6081075.0 + x2 * (
                -929569.0 / 638512875.0))))))))
    else:
        small = x * (1.0 + x2 * (-1.0 / 3.0 + x2 * (2.0 / 15.0 + x2 * (-17.0 / 315.0))))
    mid = (1.0 - e) / (1.0 + e)
    big = 1.0 - 2.0 * e / (1.0 + e)
    # the series carries x's sign itself, so tanh(-0.0) is -0.0 (as the sign select alone gave +0.0)
    t = tl.where(ax < 0.55, mid, big)
    return tl.where(ax < 0.1, small, tl.where(x < 0, -t, t))


@triton.jit
def log1p(x):
    # Goldberg's trick: log(u) * x / (u - 1) with u = 1 + x corrects the rounding of 1 + x. At x = +inf the
    # correction factor is inf / inf = NaN, so an infinite u takes log(u) = inf uncorrected (torch.log1p(inf))
    u = 1.0 + x
    d = u - 1.0
    safe = tl.where((d == 0.0) | (d == float("inf")), 1.0, d)
    return tl.where(d == 0.0, x, tl.where(d == float("inf"), u, tl.log(u) * (x / safe)))


@triton.jit
def _atanh2(s):
    # 2 atanh(s) = log((1 + s) / (1 - s)) for 0 <= s <= 1/3 as s * p(s^2), p the degree-4 polynomial of least
    # maximum relative error against 2 atanh(s) / s on s^2 in [0, 1/9] (fitted in float64: 4.0e-9 relative). In
    # float32 it gives 1.22e-7 max relative error over (0, 1/3], where the odd series to s^13 it replaces (two more
    # FFMAs, truncation < 2e-8) gave 1.18e-7: the float32 evaluation, not the polynomial, sets the error. log1p(u)
    # as a degree-9 polynomial in u (no reciprocal, as accurate) measured 1.0-1.8% slower on bce_loss at
    # 8192x4096x1024 (H100, 2026-11-27, docs/benchmarks-log.md "log1p by a polynomial in u")
    s2 = s * s
    p = 0.2817833125591278 * s2 + 0.27960604429244995
    p = p * s2 + 0.40024909377098083
    p = p * s2 + 0.6666631698608398
    p = p * s2 + 2.0
    return s * p


@triton.jit
def logsigmoid(x):
    # log(sigmoid(x)) = min(x, 0) - log1p(u), u = exp(-|x|) in (0, 1]: no rounding of sigmoid, no underflow (eager's
    # log(sigmoid(x)) is -inf below x = -103.9; this gives x). fp32: log1p(u) = 2 atanh(s), s = u / (2 + u) in
    # (0, 1/3]: FFMAs and one divide where tl.log is a ~20-instruction sequence. fp64: tlmath.log1p (the series
    # is an fp32 one).
    u = tl.exp(-tl.abs(x))
    if x.dtype == tl.float64:
        t = log1p(u)
    else:
        t = _atanh2(u / (2.0 + u))
    # min(x, 0) as a compare and a select, on purpose: one min instruction (tl.minimum) took 252 of 6705 SASS
    # instructions off bce_loss's kernel and ran it 2.6-2.9% slower at 8192x4096x1024 and 1% slower at
    # 8192x8192x4096 (H200, 2026-11-27, docs/benchmarks-log.md "min(x, 0) in logsigmoid")
    return tl.where(x < 0, x, 0.0) - t


@triton.jit
def erf(x):
    return tl.erf(x)


@triton.jit
def rsqrt(x):
    return 1.0 / tl.sqrt(x)


@triton.jit
def relu(x):
    # NaN stays NaN, as in torch.relu: one max.NaN instruction on the GPU (nested selects took four)
    return tl.maximum(x, 0, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def maximum(a, b):
    # torch.maximum propagates NaN from either side, and on a tie returns its first operand, as eager's CPU and
    # CUDA kernels do (maximum(-0.0, 0.0) is -0.0; this returned the second, found 2026-11-29)
    return tl.where(a != a, a, tl.where((b > a) | (b != b), b, a))


@triton.jit
def minimum(a, b):
    return tl.where(a != a, a, tl.where((b < a) | (b != b), b, a))


@triton.jit
def max_nan(a, b):
    # reduction combine of torch.amax: NaN from either side wins; one max.NaN instruction on the GPU
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def min_nan(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def clamp(x, lo, hi):
    # torch.clamp: min(max(x, lo), hi), NaN propagating from x and from either bound (torch.clamp(x, nan) is
    # NaN everywhere, also for a tensor bound's NaN elements); a constant bound's NaN test folds away
    # (selects, not an | of the masks: Triton's interpreter cannot or a tile's mask with a loaded scalar's)
    y = tl.where(x < lo, lo, x)
    y = tl.where(y > hi, hi, y)
    return tl.where(lo != lo, lo, tl.where(hi != hi, hi, y))


@triton.jit
def sign(x):
    # torch.sign: NaN and -0.0 give 0.0
    return tl.where(x > 0, 1.0, tl.where(x < 0, -1.0, 0.0))


@triton.jit
def round_half_even(x):
    r = tl.floor(x + 0.5)
    tie = (r - x) == 0.5
    odd = (r - 2.0 * tl.floor(r * 0.5)) != 0.0
    r = tl.where(tie & odd, r - 1.0, r)
    r = tl.where(r == 0.0, x * 0.0, r)  # x's sign on a zero: round(-0.5) and round(-0.0) are -0.0
    # from 2^23 (2^52 in float64) every value is an integer, and x + 0.5 rounds: an odd 8388609.0 became 8388610
    # (found 2026-11-29)
    if x.dtype == tl.float64:
        big = 4503599627370496.0
    else:
        big = 8388608.0
    return tl.where(tl.abs(x) >= big, x, r)


@triton.jit
def neg(x):
    # -x, -0.0 for +0.0 included: Triton 3.6 lowers a float's unary minus to 0 - x, which gives +0.0 there
    # ((-0.0) ** 5 came back +0.0 on an H200, 2026-11-29); Triton 3.9 emits fneg. x * -1.0 is fneg on both
    # (LLVM folds the product into the negation, so it costs nothing).
    if x.dtype.is_floating():
        return x * -1.0
    else:
        return -x


@triton.jit
def signbit(x):
    # x's sign bit, -0.0 included: a compare on the bits, where the test it replaces (x == 0 and 1 / x < 0) took
    # a divide
    if x.dtype == tl.float64:
        return x.to(tl.int64, bitcast=True) < 0
    else:
        return x.to(tl.float32).to(tl.int32, bitcast=True) < 0


@triton.jit
def powf(x, p: tl.constexpr, PARITY: tl.constexpr):
    # x ** p for a constant p other than 0, as exp2(p * log2|x|) with the sign and edge values of torch.pow:
    # PARITY is 1 for an odd integer p (the result takes x's sign, -0.0 and -inf included), 2 for an even one
    # (|x| ** p), 0 otherwise (a finite x < 0 gives NaN; -inf gives +inf or +0 as |x| does). |x| = 0 and inf
    # need no case of their own: exp2 of -inf / +inf is 0 / inf.
    # The product p * log2|x| carries log2's rounding times |p log2 x|, and exp2 turns that absolute error into a
    # relative one: in float32 it was up to 100 ulps at p = 40 and 35 at p = 2.7 against eager's powf (2026-11-29).
    # A float32 x therefore goes through float64, where the same error is 2^29 times smaller, and is rounded once:
    # within an ulp of eager's powf. p is first rounded to float32 as eager rounds it: ATen's CUDA kernel converts
    # the exponent to the tensor's dtype, and so does its vectorized CPU path (only the CPU's scalar tail, the last
    # elements of a row that fill no vector, takes the double exponent). float64 has no wider type here: its error
    # stays up to |ln(x ** p)| ulps or so (docs/epilogues.md, "Dtypes"); on a GPU `pow_gpu` replaces it there with
    # eager's own function.
    if x.dtype == tl.float32:
        p32 = tl.zeros_like(x) + p
        y = _pow_exp2(x.to(tl.float64), p32.to(tl.float64), PARITY).to(tl.float32)
    else:
        y = _pow_exp2(x, p, PARITY)
    return y


@triton.jit
def _pow_exp2(x, p, PARITY: tl.constexpr):
    y = tl.exp2(p * tl.log2(tl.abs(x)))
    if PARITY == 1:
        y = tl.where(signbit(x), neg(y), y)
    elif PARITY == 0:
        y = tl.where((x < 0) & (x != float("-inf")), float("nan"), y)
    return y


@triton.jit
def ones_like(x):
    return tl.where(x == x, 1.0, 1.0)


@triton.jit
def float_to_key(x, ITYPE: tl.constexpr, SHIFT: tl.constexpr, MASK: tl.constexpr):
    # A signed integer whose order matches the float order (negative floats included), for atomic max/min.
    # NaN becomes the largest key, so atomic max lets it win; the min path negates it first (see key_nan_min).
    b = x.to(ITYPE, bitcast=True)
    return b ^ ((b >> SHIFT) & MASK)


@triton.jit
def key_to_float(k, FTYPE: tl.constexpr, SHIFT: tl.constexpr, MASK: tl.constexpr):
    b = k ^ ((k >> SHIFT) & MASK)
    return b.to(FTYPE, bitcast=True)


# ------------------------------------------------------------------------------------------- fast-math (GPU only)
@triton.jit
def tanh_approx(x):
    # MUFU.TANH (sm_75+): one instruction; max relative error 1.1e-5 measured on an H200 (the PTX ISA promises about
    # 2^-11); tanh(+-inf) = +-1, NaN stays NaN
    return tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=r,r", [x.to(tl.float32)], dtype=tl.float32,
                                     is_pure=True, pack=1)


@triton.jit
def _ex2_ftz(x):
    # 2^x, one MUFU.EX2 (tl.exp / tl.exp2 add a denormal range fix-up: 4 more instructions); results below 2^-126
    # flush to zero
    return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True,
                                     pack=1)


@triton.jit
def _rcp_ftz(x):
    # 1 / x, one MUFU.RCP (a true divide adds range scaling)
    return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True,
                                     pack=1)


@triton.jit
def tanh_gpu(x):
    # `tanh` for float32 with its exp and reciprocal as bare MUFU ops: the same values in fewer instructions, not an
    # approximation of it. On sm_90, `tanh` compiles to ex2.approx behind a range fix-up for results below 2^-126
    # (a compare and two predicated multiplies) and its divides to one rcp.approx behind div.full's fix-up for
    # divisors above 2^126 (a compare and three predicated multiplies). Neither range is reached here: 1 + e lies in
    # (1, 2], and e = exp(-2|x|) is below 2^-126 only where |x| > 43.6, whose tanh is 1 in float32 whether e
    # flushes to 0 or not. 27 -> 21 SASS instructions a value (Triton 3.9, sm_90, offline), and the same bits as
    # `tanh` (checked on an H200: benchmarks/fastmath_check.py)
    x = x.to(tl.float32)
    ax = tl.abs(x)
    e = _ex2_ftz(ax * -2.0 * 1.4426950408889634)
    x2 = ax * ax
    small = x * (1.0 + x2 * (-1.0 / 3.0 + x2 * (2.0 / 15.0 + x2 * (-17.0 / 315.0))))
    r = _rcp_ftz(1.0 + e)
    mid = (1.0 - e) * r
    big = 1.0 - (2.0 * e) * r
    t = tl.where(ax < 0.55, mid, big)
    return tl.where(ax < 0.1, small, tl.where(x < 0, -t, t))


@triton.jit
def pow_gpu(x, p: tl.constexpr):
    # x ** p for float64 x as eager computes it on a GPU: ATen's pow kernel calls the CUDA math library's pow, which
    # is libdevice's __nv_pow: eager's bits for every exponent eager does not special-case (checked on an H200 for
    # 2.7, -1.3, 0.33, 1.5, 4, -3, -4, 5, 33, -35, 2026-11-29), where `powf`'s exp2(p * log2|x|) is up to some
    # hundred ulps off in float64. Not for float32: libdevice's __nv_powf differed from eager's float32 pow in 40%
    # of the values there (OpDef.triton_gpu_computes). libdevice does not run in the interpreter: GPU only.
    return libdevice.pow(x, tl.zeros_like(x) + p)


@triton.jit
def sigmoid_approx(x):
    # 1 / (1 + 2^(-x log2 e)) with ex2.approx and rcp.approx (2 MUFU ops + 2): max relative error 1.79e-6 measured on
    # an H200 for x in [-30, 30], as `sigmoid` (1.75e-6), also where sigmoid is tiny; 0.5 * tanh.approx(x / 2) + 0.5
    # has an absolute error there (it returned 0 for x < -17: relative error 1); x -> -inf gives 0, +inf gives 1
    return _rcp_ftz(1.0 + _ex2_ftz(x.to(tl.float32) * -1.4426950408889634))


@triton.jit
def logsigmoid_approx(x):
    # `logsigmoid` with its exp and divide as single MUFU ops (ex2.approx, rcp.approx: a few ulp, like tl.exp's own
    # ex2.approx): about 14 instructions per element against 25; a result below 2^-126 in magnitude (x > 87) flushes
    # to zero
    x = x.to(tl.float32)
    u = _ex2_ftz(tl.abs(x) * -1.4426950408889634)
    return tl.where(x < 0, x, 0.0) - _atanh2(u * _rcp_ftz(2.0 + u))

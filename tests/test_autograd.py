"""Gradients of evt.gemm: float64 gradcheck on the reference executor, table-driven.

Every differentiable op of the registry, every input role (aux, row, column, 0-d scalar tensor, batched and
transposed), every reduction and the output views are checked with ``torch.autograd.gradcheck`` (which compares
the generated backward against finite differences), and the amax/amin tie rule against torch autograd.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import evtorch as evt
from evtorch.ops import REGISTRY

DT = torch.float64
M, N, K, L = 3, 4, 2, 2


def rand(*shape):
    return torch.randn(shape, dtype=DT).requires_grad_()


def check(fn, A, B, fast=True, **inputs):
    """gradcheck of evt.gemm(A, B, fn, **inputs) w.r.t. A, B and every tensor input requiring grad."""
    names = [n for n, v in inputs.items() if isinstance(v, torch.Tensor) and v.requires_grad]

    def f(A, B, *ts):
        kw = dict(inputs, **dict(zip(names, ts)))
        out = evt.gemm(A, B, fn, **kw)
        return tuple(o for o in (out if isinstance(out, tuple) else (out,)) if o.dtype.is_floating_point)
    args = (A, B, *[inputs[n] for n in names])
    assert torch.autograd.gradcheck(f, args, fast_mode=fast, atol=1e-6, rtol=1e-5)


def operands(batched=False, b_batched=True):
    lead = (L,) if batched else ()
    return rand(*lead, M, K), rand(*((L,) if batched and b_batched else ()), K, N)


# ---------------------------------------------------------------------------------------------- every op
# (op name, epilogue using it). acc is kept away from non-differentiable points (|x| > 0, > 0 for logs).
UNARY = {
    "neg": lambda x: -x, "abs": lambda x: (x + 3.0).abs() + x.abs() * 0.0 + torch.abs(x - 5.0),
    "exp": torch.exp, "exp2": torch.exp2, "log": lambda x: torch.log(x * x + 1.0),
    "log2": lambda x: torch.log2(x * x + 1.0), "log1p": lambda x: torch.log1p(x * x),
    "sqrt": lambda x: torch.sqrt(x * x + 1.0), "rsqrt": lambda x: torch.rsqrt(x * x + 1.0),
    "tanh": torch.tanh, "sigmoid": torch.sigmoid, "logsigmoid": F.logsigmoid, "erf": torch.erf,
    "relu": lambda x: torch.relu(x + 0.01), "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu, "softplus": F.softplus, "softplus_beta": lambda x: F.softplus(x, beta=2.0, threshold=1.0),
    "leaky_relu": lambda x: F.leaky_relu(x + 0.01, 0.2), "hardswish": lambda x: F.hardswish(x * 2.0 + 0.1),
    "hardsigmoid": lambda x: F.hardsigmoid(x * 2.0 + 0.1), "elu": lambda x: F.elu(x + 0.01, alpha=0.7),
    "square": torch.square, "reciprocal": lambda x: torch.reciprocal(x * x + 1.0),
    "pow2": lambda x: x ** 2, "pow3": lambda x: x ** 3, "pow_half": lambda x: (x * x + 1.0) ** 0.5,
    "pow_neg": lambda x: (x * x + 1.0) ** -1.5, "pow_frac": lambda x: (x * x + 1.0) ** 1.7,
    "floor": lambda x: torch.floor(x) + x, "ceil": lambda x: torch.ceil(x) * x, "round": lambda x: torch.round(x) + x,
    "sign": lambda x: torch.sign(x) * x,
    "clamp": lambda x: torch.clamp(x, -0.3, 0.4) + x * 0.1, "clamp_min": lambda x: x.clamp(min=0.05),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_op_gradients(name):
    torch.manual_seed(1)
    A, B = operands()
    fn = UNARY[name]
    check(lambda acc: fn(acc), A, B)


@pytest.mark.parametrize("low, tol", [(torch.float32, 1e-6), (torch.float16, 2e-3)], ids=["float", "half"])
def test_cast_gradient_matches_torch(low, tol):
    """x.float() rounds (finite differences are meaningless there): compare with torch autograd instead. Torch
    also rounds the gradient flowing through a 16-bit intermediate to 16 bits; evtorch keeps it in the compute
    dtype, hence the half tolerance."""
    torch.manual_seed(1)
    A, B = operands()
    fn = lambda acc: torch.tanh(acc.to(low)).double() * 2.0  # noqa: E731
    w = torch.randn(M, N, dtype=DT)
    got = torch.autograd.grad((evt.gemm(A, B, fn) * w).sum(), (A, B))
    want = torch.autograd.grad((fn(A @ B) * w).sum(), (A, B))
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r, rtol=tol, atol=tol)


BINARY = {
    "add": lambda acc, C: acc + C, "add_alpha": lambda acc, C: torch.add(acc, C, alpha=2.5),
    "sub": lambda acc, C: C - acc, "sub_alpha": lambda acc, C: torch.sub(acc, C, alpha=0.5),
    "mul": lambda acc, C: acc * C, "div": lambda acc, C: acc / (C * C + 1.0), "rdiv": lambda acc, C: C / (acc * acc + 1.0),
    "fma": lambda acc, C: acc * C + acc, "maximum": lambda acc, C: torch.maximum(acc, C),
    "minimum": lambda acc, C: torch.minimum(acc, C), "logaddexp": lambda acc, C: torch.logaddexp(acc, C), "where": lambda acc, C: torch.where(acc > C, acc * 2.0, C * C),
    "clamp_tensor": lambda acc, C: torch.clamp(acc, C - 0.5, C + 0.5),
    # min > max (everywhere, and where C > 0): every element is max, which takes the whole gradient (min took it
    # too where x < min, and x none, until 2026-11-29)
    "clamp_crossed": lambda acc, C: torch.clamp(acc, C + 0.5, C - 0.5),
    "clamp_crossing": lambda acc, C: acc.clamp(C, -C),
    "compare_mask": lambda acc, C: (acc > 0).to(acc.dtype) * C + acc,
}


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_op_gradients(name):
    torch.manual_seed(2)
    A, B = operands()
    check(BINARY[name], A, B, C=rand(M, N))


def test_every_differentiable_op_is_covered():
    """A new op in the registry needs a gradient test here (composites are covered through their primitives)."""
    covered = {"neg", "abs", "exp", "exp2", "log", "log2", "log1p", "sqrt", "rsqrt", "tanh", "sigmoid", "logsigmoid",
               "erf", "relu", "pow", "floor", "ceil", "round", "sign", "cast", "clamp", "add", "sub", "mul", "div", "fma",
               "maximum", "minimum", "where", "sum", "mean", "amax", "amin", "logsumexp", "logaddexp"}
    primitives = {op.name for op in REGISTRY.ops.values() if op.decompose is None and op.derivative is not None
                  and op.user_defined is None}
    non_differentiable = {"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_not"}
    assert primitives - non_differentiable - covered == set()


# ---------------------------------------------------------------------------------------------- input roles
ROLES = {
    "aux": (lambda: rand(M, N), lambda acc, X: torch.tanh(acc * X)),
    "row": (lambda: rand(N), lambda acc, X: torch.sigmoid(acc + X) * X),
    "row_2d": (lambda: rand(1, N), lambda acc, X: F.gelu(acc - X)),
    "col": (lambda: rand(M), lambda acc, X: torch.exp(acc * X[:, None])),
    "col_view": (lambda: rand(M), lambda acc, X: acc * X.view(-1, 1) + X.view(-1, 1) ** 2),
    "col_2d": (lambda: rand(M, 1), lambda acc, X: acc / (X * X + 1.0)),
    "scalar_0d": (lambda: rand(), lambda acc, X: F.silu(acc * X) + X),
    "scalar_1elem": (lambda: rand(1), lambda acc, X: acc * X + X * X),
    "transposed": (lambda: rand(N, M), lambda acc, X: acc * X.T + X.t()),
    "twice_bound": (lambda: rand(M), lambda acc, X: acc + X[:, None] * X[:, None]),
    "input_only_math": (lambda: rand(N), lambda acc, X: acc * torch.exp(X) + X * X),
}


@pytest.mark.parametrize("role", sorted(ROLES))
def test_input_role_gradients(role):
    torch.manual_seed(3)
    make, fn = ROLES[role]
    A, B = operands()
    check(fn, A, B, X=make())


def test_square_input_bound_both_ways():
    """v (M,) used as a column and, with M == N, as a row: two loads, one gradient."""
    torch.manual_seed(4)
    A, B = rand(N, K), rand(K, N)
    check(lambda acc, v: acc * v[:, None] + v, A, B, v=rand(N))


BATCHED = {
    "aux": (lambda: rand(L, M, N), lambda acc, X: acc * X),
    "aux_unbatched": (lambda: rand(M, N), lambda acc, X: torch.tanh(acc + X)),
    "row": (lambda: rand(L, 1, N), lambda acc, X: acc * X),
    "col": (lambda: rand(L, M, 1), lambda acc, X: acc + X * X),
    "per_batch": (lambda: rand(L, 1, 1), lambda acc, X: torch.sigmoid(acc * X)),
    "row_shared": (lambda: rand(N), lambda acc, X: acc * X),
}


@pytest.mark.parametrize("role", sorted(BATCHED))
@pytest.mark.parametrize("b_batched", [True, False], ids=["B_batched", "B_broadcast"])
def test_batched_input_gradients(role, b_batched):
    torch.manual_seed(5)
    make, fn = BATCHED[role]
    A, B = operands(batched=True, b_batched=b_batched)
    check(fn, A, B, X=make())


def test_python_scalars_and_non_differentiable_inputs():
    torch.manual_seed(6)
    A, B = operands()
    mask = torch.rand(M, N) > 0.5
    idx = torch.arange(N)
    check(lambda acc, C, mask, idx, alpha, beta: torch.where(mask, alpha * acc, beta * C) + idx * 0.01,
          A, B, C=rand(M, N), mask=mask, idx=idx, alpha=1.5, beta=-0.75)


def test_indices_in_the_epilogue():
    torch.manual_seed(7)
    A, B = operands()
    check(lambda acc, w: torch.where(evt.row_index(acc) > evt.col_index(acc), acc * w, acc), A, B, w=rand())


# ---------------------------------------------------------------------------------------------- reductions
REDUCTIONS = {
    "sum_rows": lambda acc, b: ((acc + b) ** 2).sum(1),
    "sum_cols": lambda acc, b: torch.tanh(acc + b).sum(0),
    "sum_all": lambda acc, b: (acc * b).sum(),
    "sum_keepdim": lambda acc, b: (acc + b).sum(dim=1, keepdim=True),
    "mean_rows": lambda acc, b: torch.sigmoid(acc * b).mean(1),
    "mean_all": lambda acc, b: (acc + b).mean(),
    "amax_rows": lambda acc, b: (acc * b).amax(1),
    "amin_cols": lambda acc, b: (acc - b).amin(0),
    "amax_all": lambda acc, b: (acc + b).amax(),
    "logsumexp_rows": lambda acc, b: (acc + b).logsumexp(1),
    "logsumexp_cols": lambda acc, b: torch.logsumexp(acc * b, dim=0),
    "vector_stage_math": lambda acc, b: torch.exp(acc.sum(1) * 0.1) + (acc * b).amax(1) * 2.0,
    "reduction_of_broadcast": lambda acc, b: (torch.zeros_like(acc) + b).sum(0) + acc.sum(0),
    "tile_and_reductions": lambda acc, b: (torch.relu(acc + b), (acc + b).sum(1), (acc * b).logsumexp(0)),
}


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_reduction_gradients(name):
    torch.manual_seed(8)
    A, B = operands()
    check(REDUCTIONS[name], A, B, fast=False, b=rand(N))


@pytest.mark.parametrize("over", [(0,), (1,), (2,), (0, 1), (1, 2), None], ids=str)
def test_batched_reductions(over):
    torch.manual_seed(9)
    A, B = operands(batched=True)
    check(lambda acc, b: (torch.tanh(acc) * b).sum(dim=over) if over else torch.tanh(acc * b).sum(), A, B, b=rand(N))


def test_cross_entropy_style_epilogue():
    """logsumexp (a softmax backward) and a mean in one loss, with a one-hot target through col_index."""
    torch.manual_seed(10)
    A, B = operands()
    target = torch.tensor([1, 3, 0])

    def ce(acc, target):
        picked = torch.where(evt.col_index(acc) == target[:, None], acc, 0.0).sum(1)
        return (acc.logsumexp(1) - picked).mean()
    check(ce, A, B, fast=False, target=target)


# ---------------------------------------------------------------------------------------------- views
VIEWS = {
    "transposed_output": lambda acc, b: (acc + b).T,
    "t_method": lambda acc, b: torch.sigmoid(acc).t() * 2.0,
    "permuted_batched": None,
    "merged_rows": None,
    "unsqueezed": lambda acc, b: (acc * b)[None],
    "col_keepdim_view": lambda acc, b: acc.sum(1).view(-1, 1),
    "expanded": lambda acc, b: b.expand(M, N) * acc,
}


@pytest.mark.parametrize("name", [n for n, f in VIEWS.items() if f is not None])
def test_view_gradients(name):
    torch.manual_seed(11)
    A, B = operands()
    check(VIEWS[name], A, B, b=rand(N))


def test_batched_output_views():
    torch.manual_seed(12)
    A, B = operands(batched=True)
    check(lambda acc, C: ((acc * C).permute(0, 2, 1), (acc + C).reshape(L * M, N)), A, B, C=rand(L, M, N))


# ---------------------------------------------------------------------------------------------- ties
@pytest.mark.parametrize("op", ["amax", "amin"])
@pytest.mark.parametrize("dim", [0, 1, None])
def test_ties_share_the_gradient_like_torch(op, dim):
    """relu makes exact ties (rows of zeros): torch gives each tied element grad / count; so must we."""
    torch.manual_seed(13)
    A, B = rand(4, 3), rand(3, 5)
    shift = torch.tensor([0.0, 100.0, -100.0, 0.0], dtype=DT)  # row 1 all zero after relu, row 2 all positive

    def fn(acc, s):
        x = torch.relu(acc - s[:, None])
        return getattr(x, op)(dim) if dim is not None else getattr(x, op)()
    out = evt.gemm(A, B, fn, s=shift)
    ref = fn(A @ B, s=shift)
    torch.testing.assert_close(out, ref)
    w = torch.randn_like(ref)
    got = torch.autograd.grad((out * w).sum(), (A, B))
    want = torch.autograd.grad((ref * w).sum(), (A, B))
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r)


# ---------------------------------------------------------------------------------------------- which grads
def test_gradients_only_where_required():
    torch.manual_seed(14)
    A, B = operands()
    A.requires_grad_(False)
    b, C = rand(N), torch.randn(M, N, dtype=DT)
    out = evt.gemm(A, B, lambda acc, b, C: F.gelu(acc + b) * C, b=b, C=C)
    gB, gb = torch.autograd.grad(out.sum(), (B, b))
    acc = A @ B
    ref = F.gelu(acc + b) * C
    rB, rb = torch.autograd.grad(ref.sum(), (B, b))
    torch.testing.assert_close(gB, rB)
    torch.testing.assert_close(gb, rb)


def test_inputs_the_backward_does_not_read():
    """s (0-d) and C are not kept (d(acc) = g): the backward gets stand-ins it never loads."""
    torch.manual_seed(18)
    A, B = operands()
    s, C = torch.tensor(0.5, dtype=DT), torch.randn(M, N, dtype=DT)
    check(lambda acc, s, C: acc + s + C, A, B, s=s, C=C)


def test_only_an_input_requires_grad():
    torch.manual_seed(15)
    A, B = torch.randn(M, K, dtype=DT), torch.randn(K, N, dtype=DT)
    check(lambda acc, b: torch.tanh(acc + b).sum(0), A, B, b=rand(N))


def test_unused_outputs_and_outputs_independent_of_inputs():
    torch.manual_seed(16)
    A, B = operands()
    b = rand(N)
    D, rowsum, mask = evt.gemm(A, B, lambda acc, b: (acc + b, (acc * acc).sum(1), acc > 0), b=b)
    assert mask.dtype == torch.bool and not mask.requires_grad
    gA, gb = torch.autograd.grad(rowsum.sum(), (A, b), allow_unused=True)
    torch.testing.assert_close(gA, torch.autograd.grad(((A @ B) ** 2).sum(), A)[0])
    assert gb is None


def test_no_grad_path_is_unchanged():
    A, B = operands()
    with torch.no_grad():
        out = evt.gemm(A, B, lambda acc: acc.T)
    assert not out.requires_grad and out.shape == (N, M)


def test_outputs_argument_prunes():
    torch.manual_seed(17)
    A, B = operands()
    D, s = evt.gemm(A, B, lambda acc: (torch.exp(acc), acc.sum(0)), outputs=[1])
    assert D is None
    torch.testing.assert_close(torch.autograd.grad(s.sum(), A)[0], torch.autograd.grad((A @ B).sum(), A)[0])


def test_double_backward_is_a_clear_error():
    A, B = operands()
    out = evt.gemm(A, B, lambda acc: torch.tanh(acc))
    gA, = torch.autograd.grad(out.sum(), A, create_graph=True)
    with pytest.raises(evt.EpilogueError, match="double backward"):
        gA.sum().backward()


def test_op_without_derivative_is_a_clear_error():
    import triton

    @triton.jit
    def _cube_tl(x):
        return x * x * x
    cube = evt.register_op("cube_no_grad_test", lambda x: x * x * x, _cube_tl)
    A, B = operands()
    with pytest.raises(evt.EpilogueError, match="cube_no_grad_test.*no derivative rule"):
        evt.gemm(A, B, lambda acc: cube(acc)).sum().backward()


def test_registered_op_with_derivative():
    import triton

    @triton.jit
    def _cube_tl(x):
        return x * x * x
    cube = evt.register_op("cube_grad_test", lambda x: x * x * x, _cube_tl,
                           derivative=lambda g, x, out: (3.0 * g * x * x,))
    A, B = operands()
    check(lambda acc: cube(acc), A, B)



# ------------------------------------------------------------------------------ outputs that never read acc
@pytest.mark.parametrize("fn", [lambda acc, C: C * 2, lambda acc, C: (C, acc), lambda acc, C: (acc, C + 0),
                                lambda acc, C: (acc, C.sum(dim=1))], ids=["no_acc", "C_acc", "acc_C0", "acc_rowsum"])
def test_outputs_without_acc_differentiate(fn):
    """An epilogue whose outputs (or some of them) never read acc: gradcheck in float64. An epilogue without acc
    crashed in the forward (no acc node to differentiate against), and in float64 a zero gradient folded before
    its cast to float64 crashed the backward (found 2026-11-29)."""
    A, B = operands()
    check(fn, A, B, C=rand(M, N))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gradient_reaching_only_outputs_without_acc(dtype):
    """The gradient seeds only an output that does not read acc: dC is that output's, dA is zero."""
    A = torch.randn(M, K, dtype=dtype, requires_grad=True)
    B = torch.randn(K, N, dtype=dtype)
    C = torch.randn(M, N, dtype=dtype, requires_grad=True)
    _, s = evt.gemm(A, B, lambda acc, C: (acc, C.sum(dim=1)), C=C)
    s.sum().backward()
    torch.testing.assert_close(C.grad, torch.ones_like(C))
    assert A.grad is None or not A.grad.any()


@pytest.mark.interpreter
def test_epilogue_without_acc_differentiates_on_the_triton_backend():
    A = torch.randn(8, 5, requires_grad=True)
    C = torch.randn(8, 6, requires_grad=True)
    out = evt.gemm(A, torch.randn(5, 6), lambda acc, C: C * 2 + 1, C=C, backend="triton")
    out.sum().backward()
    torch.testing.assert_close(out, C.detach() * 2 + 1)
    torch.testing.assert_close(C.grad, torch.full_like(C, 2.0))
    assert A.grad is None or not A.grad.any()


# ------------------------------------------------------------------------------------ user-registered ops
_USER_OPS: dict = {}


def _triple_jit():
    import triton

    @triton.jit
    def _triple(x):
        return 3 * x
    return _triple


def test_register_op_derivative_may_return_one_bare_gradient():
    """A unary op's rule may return its gradient bare (before: 'returned 6 gradients for 1 operands', or a
    control-flow error at M = 1, found 2026-11-29); float64 gradcheck at M = 3 and M = 1."""
    if "triple" not in _USER_OPS:  # once per process: the registry refuses a second op of a name
        _USER_OPS["triple"] = evt.register_op("triple_user_op_test", lambda x: 3 * x, _triple_jit(),
                                              derivative=lambda g, x, out: 3 * g)
    triple = _USER_OPS["triple"]
    for rows in (M, 1):
        check(lambda acc, C: triple(acc) * C, rand(rows, K), rand(K, N), C=rand(rows, N))


def test_builtin_epilogue_and_builtin_torch_fn():
    """evt.gemm takes a builtin such as torch.tanh as a unary epilogue, as evt.linear does (it was refused for
    lack of an inspectable signature); register_op says what to pass instead of a builtin torch_fn."""
    A, B = operands()
    torch.testing.assert_close(evt.gemm(A, B, torch.tanh), torch.tanh(A @ B))
    check(torch.sigmoid, A, B)
    with pytest.raises(evt.EpilogueTypeError, match=r"pass a Python function, e.g. lambda x: torch.cos\(x\)"):
        evt.register_op("cos_builtin_test", torch.cos, _triple_jit())


@pytest.mark.parametrize("backend", ["reference", pytest.param("triton", marks=pytest.mark.interpreter)])
def test_outputs_may_be_modified_in_place(backend):
    """A residual ``h += x`` on a fused layer's output, as on F.linear's: the outputs are not views made inside
    the autograd Function (autograd refused in-place ops on them: "Output 0 of FusedGemm is a view and is being
    modified inplace"), and the gradients are those of the modified value."""
    import os
    if backend == "triton" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs TRITON_INTERPRET=1")
    A, B = operands()
    x = rand(M, N)
    h, s = evt.gemm(A, B, lambda acc: (torch.exp(acc), acc.sum(1)), backend=backend)
    h += x
    h.mul_(2)
    (h.square().sum() + s.sum()).backward()
    A2, B2, x2 = (t.detach().clone().requires_grad_() for t in (A, B, x))
    acc = A2 @ B2
    ((2 * (torch.exp(acc) + x2)).square().sum() + acc.sum(1).sum()).backward()
    for got, want in ((A.grad, A2.grad), (B.grad, B2.grad), (x.grad, x2.grad)):
        torch.testing.assert_close(got, want)
    y = evt.linear(A, B.T.detach().requires_grad_(), F.gelu)
    y.add_(1)
    y.sum().backward()


def _in_place_cases():
    """(name, make) pairs: ``make(api)`` builds fresh random tensors, runs a product through ``api`` (evtorch's or
    eager's calls, same signature), modifies a tensor the backward needs in place and returns the loss."""
    x3 = (2, 3, K)

    def row(api, grad_mode):  # a (N,) row input, a leaf modified under no_grad or a non-leaf modified in grad mode
        A, B, b = *operands(), rand(N)
        v = b if grad_mode == "leaf" else b * 2
        out = api.gemm(A, B, lambda acc, b: acc * b, b=v)
        with torch.no_grad() if grad_mode == "leaf" else torch.enable_grad():
            v.add_(1)
        return out.sum()

    def col(api):  # an (M, 1) column input
        A, B, c = *operands(), rand(M, 1) * 2
        out = api.gemm(A, B, lambda acc, c: acc * c, c=c)
        c.mul_(3)
        return out.sum()

    def base_of_row(api):  # the row input is a view of a tensor the caller modifies
        A, B, P = *operands(), rand(2, N) * 1
        out = api.gemm(A, B, lambda acc, b: acc * b, b=P[0])
        P.add_(1)
        return out.sum()

    def linear(api, which, shape=(M, K)):  # evt.linear's weight (saved transposed), x (reshaped) or bias
        x, W, bias = rand(*shape), rand(N, K), rand(N)
        t = {"weight": W, "x": x, "bias": bias}
        if which != "weight":
            t[which] = t[which] * 1
        out = api.linear(t["x"], t["weight"], lambda y: y * y, t["bias"])
        with torch.no_grad():
            t[which].add_(1)
        return out.sum()

    return [("row leaf", lambda api: row(api, "leaf")), ("row non-leaf", lambda api: row(api, "non-leaf")),
            ("column", col), ("view of a modified base", base_of_row),
            ("linear weight", lambda api: linear(api, "weight")),
            ("linear weight, 3-D x", lambda api: linear(api, "weight", x3)),
            ("linear x, 3-D", lambda api: linear(api, "x", x3)),
            # eager's linear does not save its bias; evtorch's backward recomputes the activation's input from it
            ("linear bias", lambda api: linear(api, "bias"))]


class _Eager:
    """evt.gemm's and evt.linear's signatures on eager torch (the in-place test's reference)."""

    @staticmethod
    def gemm(A, B, fn, **inputs):
        return fn(A @ B, **inputs)

    @staticmethod
    def linear(x, W, fn, bias):
        return fn(F.linear(x, W, bias))


@pytest.mark.parametrize("backend", ["reference", pytest.param("triton", marks=pytest.mark.interpreter)])
@pytest.mark.parametrize("name, make", _in_place_cases(), ids=[n for n, _ in _in_place_cases()])
def test_inputs_modified_in_place_before_backward_get_torchs_error(backend, name, make):
    """A row / column input, or evt.linear's weight, modified in place between the forward and the backward got
    torch's "A view was created in no_grad mode ..." error (the forward saved the views it made of them, found by a
    probe 2026-11-29); as in eager, the backward now refuses with "modified by an inplace operation". (evtorch's
    linear also needs its bias, which eager's does not save: only evtorch raises there.)"""
    import functools
    import os
    if backend == "triton" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs TRITON_INTERPRET=1")

    class Evt:
        gemm = functools.partial(evt.gemm, backend=backend)
        linear = functools.partial(evt.linear, backend=backend)
    for api in (Evt,) if name == "linear bias" else (_Eager, Evt):
        loss = make(api)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            loss.backward()


@pytest.mark.parametrize("backend", ["reference", pytest.param("triton", marks=pytest.mark.interpreter)])
def test_saved_inputs_give_eagers_gradients(backend):
    """The forward saves the caller's row input, weight and 3-D x (the backward makes their views again): the
    gradients are eager's, also where another tensor was modified in place after the forward."""
    import os
    if backend == "triton" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs TRITON_INTERPRET=1")
    A, B, b, c = *operands(), rand(N), rand(M, 1)
    x, W, bias = rand(2, 3, K), rand(N, K), rand(N)
    other = torch.randn(N, dtype=DT)
    outs = (evt.gemm(A, B, lambda acc, b, c: torch.tanh(acc * b) * c, b=b * 1, c=c, backend=backend),
            evt.linear(x, W, lambda y: y * y, bias, backend=backend))
    other.add_(1)
    sum(o.sum() for o in outs).backward()
    leaves = (A, B, b, c, x, W, bias)
    got = [t.grad for t in leaves]
    for t in leaves:
        t.grad = None
    (torch.tanh((A @ B) * b) * c).sum().add(F.linear(x, W, bias).square().sum()).backward()
    for g, t in zip(got, leaves):
        torch.testing.assert_close(g, t.grad)


def test_gradient_penalty_through_autograd_grad_is_a_clear_error():
    """``torch.autograd.grad(loss, [A])`` of a loss holding a create_graph gradient (a gradient penalty) must reach
    the refusing node: it hung off a fresh leaf that autograd.grad never visits, and the second-order term was
    silently dropped. Tied to the saved operands that require grad, it raises."""
    A, B = operands()
    out = evt.gemm(A, B, lambda acc: torch.tanh(acc))
    gA, = torch.autograd.grad(out.sum(), A, create_graph=True)
    with pytest.raises(evt.EpilogueError, match="double backward"):
        torch.autograd.grad(out.sum() + gA.square().sum(), [A])
    x, W = rand(3, K), rand(N, K)
    y = evt.linear(x, W, torch.tanh)
    gx, = torch.autograd.grad(y.sum(), x, create_graph=True)
    with pytest.raises(evt.EpilogueError, match="double backward"):
        torch.autograd.grad(y.sum() + gx.square().sum(), [x])
    # frozen weights: nothing the backward saved requires grad, and a non-leaf x (a layer inside a model); the
    # node's own anchor output still ties the gradient to x
    W.requires_grad_(False)
    x0 = rand(3, K)
    x = torch.sin(x0)
    y = evt.linear(x, W, torch.tanh)
    gx, = torch.autograd.grad(y.sum(), x, create_graph=True)
    with pytest.raises(evt.EpilogueError, match="double backward"):
        torch.autograd.grad(y.sum() + gx.square().sum(), [x0])
    # an epilogue input's own penalty (C is not among what the backward saves)
    A, B = operands()
    C = rand(M, N)
    out = evt.gemm(A.detach(), B.detach(), lambda acc, C: torch.tanh(acc * C), C=C)
    gC, = torch.autograd.grad(out.sum(), C, create_graph=True)
    with pytest.raises(evt.EpilogueError, match="double backward"):
        torch.autograd.grad(gC.square().sum(), [C])
    # a create_graph backward that is not differentiated again still runs and matches eager
    gx, = torch.autograd.grad(evt.linear(x0, W, torch.tanh).sum(), x0, create_graph=True)
    want, = torch.autograd.grad(torch.tanh(x0 @ W.T).sum(), x0)
    torch.testing.assert_close(gx.detach(), want, rtol=1e-5, atol=1e-5)


def _backward_ir(fn, **inputs):
    from evtorch.integration import grad_plan
    A = torch.randn(8, 4, requires_grad=True)
    B = torch.randn(4, 16)
    return grad_plan(A, B, fn, **inputs).backward((len(fn(A @ B, **inputs)) - 1,)).show()


def test_composite_rules_apply_through_a_merged_operand_and_can_be_turned_off(monkeypatch):
    """gelu / silu are differentiated by their registry rule (torch's formula), not their decomposition's
    primitives, also when CSE merged their operand into an equal node (here ``pre``): the backward IR is the one of
    the composite alone. EVTORCH_DISABLE_PASSES=composite_grads walks the primitives (longer, same values)."""
    bias = torch.randn(16)

    def alone(acc, bias):
        return (F.silu(acc + bias),)

    def merged(acc, bias):
        pre = acc + bias
        return pre, F.silu(acc + bias)

    count = lambda ir: sum(" = compute " in line for line in ir.splitlines())  # noqa: E731
    assert count(_backward_ir(merged, bias=bias)) == count(_backward_ir(alone, bias=bias))
    assert "sigmoid" in _backward_ir(alone, bias=bias)
    short = count(_backward_ir(alone, bias=bias))
    monkeypatch.setenv("EVTORCH_DISABLE_PASSES", "composite_grads")
    assert count(_backward_ir(alone, bias=bias)) > short


@pytest.mark.parametrize("backend", ["reference", pytest.param("triton", marks=pytest.mark.interpreter)])
def test_composite_of_keyword_inputs_used_by_both_stages(backend):
    """elu of an input-only value, at exact zeros, read by a tile output and by a vector-stage one: the rule applies
    to each copy (its decomposition's gradient is NaN at 0.0: 0 / log(1) in the untaken branch)."""
    def fn(acc, b):
        e = F.elu(b * 0.0) + F.silu(b)
        return acc + e, acc.sum(0) * e

    torch.manual_seed(0)
    A = torch.randn(5, 3, requires_grad=True)
    B = torch.randn(3, 4)
    b = torch.randn(4, requires_grad=True)
    out = evt.gemm(A, B, fn, backend=backend, b=b)
    got = torch.autograd.grad(out[0].sum() + (out[1] * 2.0).sum(), (A, b))
    ref = fn(A @ B, b)
    want = torch.autograd.grad(ref[0].sum() + (ref[1] * 2.0).sum(), (A, b))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["reference", pytest.param("triton", marks=pytest.mark.interpreter)])
def test_outputs_no_gradient_reaches_do_not_require_one(backend):
    """An output that no leaf needing a gradient reaches (``v * 2`` of an input without one, beside ``acc + v``)
    came back with ``requires_grad`` True, and a backward through it gave zeros where eager raises (found by a
    probe). Each output's ``requires_grad`` is now eager's, eager and compiled, and so is the error."""
    g = torch.Generator().manual_seed(5)
    A, B = torch.randn(4, 3, generator=g), torch.randn(3, 5, generator=g)
    v, C = torch.randn(5, generator=g), torch.randn(4, 5, generator=g)

    def fn(acc, v, C):
        return acc + v, v * 2.0, (C * v).sum(0), acc.sum(1), C.exp()

    for wrt in ("A", "v", "C", "AC"):
        leaves = {"A": A, "v": v, "C": C}
        leaves = {k: (t.clone().requires_grad_() if k in wrt else t) for k, t in leaves.items()}
        want = fn(leaves["A"] @ B, leaves["v"], leaves["C"])
        run = lambda A, B, v, C: evt.gemm(A, B, fn, v=v, C=C, backend=backend)  # noqa: E731
        compiled = torch.compile(run, backend="aot_eager", fullgraph=True)
        for got in (run(leaves["A"], B, leaves["v"], leaves["C"]), compiled(leaves["A"], B, leaves["v"], leaves["C"])):
            assert [t.requires_grad for t in got] == [t.requires_grad for t in want], wrt
            quiet = next(t for t, w in zip(got, want) if not w.requires_grad)
            with pytest.raises(RuntimeError, match="does not require grad"):
                quiet.sum().backward()

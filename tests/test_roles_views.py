"""Input roles (aux, row, column, scalar; batched), views on inputs, on acc and on outputs, runtime scalars,
``evt.row_index`` / ``evt.col_index``.

Roles follow eager broadcasting against acc: each test checks the values against eager and, where the role is
the point, the IR load's shape class (``role_of`` of its axes).
"""
from __future__ import annotations

import pytest
import torch

import evtorch as evt
from evtorch.api import _cached_epilogue, get_epilogue
from evtorch.ir.types import role_of

from helpers import check_gemm, check_reference, eager_acc, operands, rand, rand_int

M, N, K, L = 6, 5, 4, 3


def load_roles(ep, name):
    """Roles of the IR loads of input ``name`` (an input used in two roles loads twice)."""
    return sorted({role_of(n.axes) + ("+L" if "L" in n.axes else "") for n in ep.graph.find("input", name)})


def _runner(backend):
    """A ``check_gemm`` runner: evt.gemm on ``backend``."""
    return lambda A, B, fn, **kw: evt.gemm(A, B, fn, backend=backend, **kw)


def roles_of(fn, A, B, **inputs):
    acc_shape = tuple(eager_acc(A, B).shape)
    return {k: load_roles(get_epilogue(fn, acc_shape, torch.float32, inputs), k) for k in inputs}


# ------------------------------------------------------------------------------------------------ 2-D roles
ROLE_CASES = [
    # (name, epilogue, input shape, expected role)
    ("aux", lambda acc, x: acc + x, (M, N), "aux"),
    ("row (N,)", lambda acc, x: acc * x, (N,), "row"),
    ("row (1, N)", lambda acc, x: acc - x, (1, N), "row"),
    ("row x[None, :]", lambda acc, x: acc + x[None, :], (N,), "row"),
    ("row x.unsqueeze(0)", lambda acc, x: acc + x.unsqueeze(0), (N,), "row"),
    ("row x.view(1, -1)", lambda acc, x: acc + x.view(1, -1), (N,), "row"),
    ("col (M, 1)", lambda acc, x: acc / (x.abs() + 1), (M, 1), "col"),
    ("col x[:, None]", lambda acc, x: acc + x[:, None], (M,), "col"),
    ("col x.unsqueeze(1)", lambda acc, x: acc + x.unsqueeze(1), (M,), "col"),
    ("col x.unsqueeze(-1)", lambda acc, x: acc + x.unsqueeze(-1), (M,), "col"),
    ("col x[..., None]", lambda acc, x: acc + x[..., None], (M,), "col"),
    ("col x.view(-1, 1)", lambda acc, x: acc + x.view(-1, 1), (M,), "col"),
    ("col x.reshape(M, 1)", lambda acc, x: acc + x.reshape(M, 1), (M,), "col"),
    ("scalar 0-d", lambda acc, x: acc * x, (), "scalar"),
    ("scalar (1, 1)", lambda acc, x: acc * x, (1, 1), "scalar"),
    ("scalar (1,)", lambda acc, x: acc + x, (1,), "scalar"),
    ("aux transposed view", lambda acc, x: acc + x.T, (N, M), "aux"),
    ("aux x.t()", lambda acc, x: acc + x.t(), (N, M), "aux"),
    ("aux permute", lambda acc, x: acc + x.permute(1, 0), (N, M), "aux"),
    ("aux squeeze", lambda acc, x: acc + x.squeeze(0), (1, M, N), "aux"),
    ("aux squeeze()", lambda acc, x: acc + x.squeeze(), (1, M, 1, N), "aux"),
    ("col expand", lambda acc, x: acc + x[:, None].expand(M, N), (M,), "col"),
    ("col expand(-1, N)", lambda acc, x: acc + x[:, None].expand(-1, N), (M,), "col"),
    ("row expand_as", lambda acc, x: acc + x.expand_as(acc), (N,), "row"),
    ("row broadcast_to", lambda acc, x: acc + torch.broadcast_to(x, (M, N)), (N,), "row"),
    ("input first operand", lambda acc, x: x - acc, (M, 1), "col"),
    ("input in where", lambda acc, x: torch.where(acc > x, acc, x), (N,), "row"),
    ("input meets acc late", lambda acc, x: torch.relu(x * 2 + 1) * acc, (M, 1), "col"),
]


@pytest.mark.parametrize("name, fn, shape, role", ROLE_CASES, ids=[c[0] for c in ROLE_CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_input_roles(name, fn, shape, role, dtype):
    A, B = operands(M, N, K, dtype, seed=1)
    x = rand(shape, dtype, seed=2)
    check_gemm(fn, A, B, x=x)
    assert roles_of(fn, A, B, x=x)["x"] == [role]
    check_reference(fn, rand((M, N), seed=3, edge=True), x=rand(shape, seed=4, edge=True))


def test_python_number_and_0d_tensor_scalars():
    def fn(acc, a, b, k, flag, t):
        return a * acc + b, acc * k + t, torch.where(acc > 0, acc, a * flag)

    A, B = operands(M, N, K, seed=5)
    kw = dict(a=1.5, b=-2.0, k=3, flag=True, t=torch.tensor(0.25))
    check_gemm(fn, A, B, **kw)
    ep = get_epilogue(fn, (M, N), torch.float32, kw)
    assert {n.target for n in ep.graph.find("scalar")} == {"a", "b", "k", "flag"}
    assert load_roles(ep, "t") == ["scalar"]


def test_square_acc_row_vs_column_follows_eager_alignment():
    """With M == N only the spelling decides: (N,) aligns with the last dim (row), v[:, None] is a column."""
    A, B = operands(N, N, K, seed=6)
    v = rand((N,), seed=7)
    fn = lambda acc, v: (acc + v, acc + v[:, None], acc + v + v[:, None])  # noqa: E731
    check_gemm(fn, A, B, v=v)
    assert roles_of(fn, A, B, v=v)["v"] == ["col", "row"]


def test_size_one_dims_of_acc():
    """M == 1 or N == 1: size-1 input dims broadcast, results keep eager's shapes."""
    fn = lambda acc, C, r, c: (acc + C + r + c, (acc * r).sum(0), (acc * c).sum(1), acc.T)  # noqa: E731
    for m, n in ((1, N), (M, 1), (1, 1)):
        A, B = operands(m, n, K, seed=8)
        check_gemm(fn, A, B, C=rand((m, n), seed=9), r=rand((n,), seed=10), c=rand((m, 1), seed=11))


def test_strided_inputs():
    """Inputs with arbitrary strides are loaded through their strides: transposed storage, slices with steps,
    storage offsets, real stride-0 (expanded) tensors."""
    def fn(acc, C, D, E, r, c):
        return acc + C + D * E + r + c

    A, B = operands(M, N, K, seed=12)
    C = rand((N, M), seed=13).t()                     # column-major
    D = rand((2 * M + 1, 3 * N), seed=14)[1::2, ::3]  # offset and steps
    E = rand((M, 1), seed=15).expand(M, N)            # stride 0 along N
    r = rand((3 * N,), seed=16)[2::3]
    c = rand((M, 2), seed=17)[:, 1:]
    check_gemm(fn, A, B, C=C, D=D, E=E, r=r, c=c)


def test_same_input_in_several_places_loads_once_per_role():
    def fn(acc, C, v):
        return acc * C + C, acc + v + v.unsqueeze(0)

    A, B = operands(M, N, K, seed=18)
    kw = dict(C=rand((M, N), seed=19), v=rand((N,), seed=20))
    check_gemm(fn, A, B, **kw)
    ep = get_epilogue(fn, (M, N), torch.float32, kw)
    assert len(ep.graph.find("input", "C")) == 1 and len(ep.graph.find("input", "v")) == 1


def test_inputs_combined_before_meeting_acc():
    """Expressions of inputs alone bind when they meet acc, where eager would align them."""
    def fn(acc, u, v, C):
        outer = u[:, None] * v            # (M, N) from a column and a row
        return acc + outer, acc - (C * 2 + u[:, None]), (v * 3)  # the last output never meets acc: (N,)

    A, B = operands(M, N, K, seed=21)
    kw = dict(u=rand((M,), seed=22), v=rand((N,), seed=23), C=rand((M, N), seed=24))
    check_gemm(fn, A, B, **kw)
    roles = roles_of(fn, A, B, **kw)
    assert roles == {"u": ["col"], "v": ["row"], "C": ["aux"]}


# ------------------------------------------------------------------------------------------------ batched
BATCHED_SHAPES = [(M, N), (L, M, N), (L, 1, N), (L, M, 1), (L, 1, 1), (1, M, N), (N,), (1, N), (M, 1), ()]


@pytest.mark.parametrize("shape", BATCHED_SHAPES, ids=[str(s) for s in BATCHED_SHAPES])
@pytest.mark.parametrize("batched_b", [True, False], ids=["B(L,K,N)", "B(K,N)"])
def test_batched_input_roles(shape, batched_b):
    A, B = operands(M, N, K, L=L, batched_b=batched_b, seed=25)
    x = rand(shape, seed=26)

    def fn(acc, x):
        z = acc * 0.5 + x
        return z, z.sum(-1), z.amax(0)

    check_gemm(fn, A, B, x=x)
    roles = roles_of(fn, A, B, x=x)["x"]
    want = {(M, N): "aux", (L, M, N): "aux+L", (L, 1, N): "row+L", (L, M, 1): "col+L", (L, 1, 1): "scalar+L",
            (1, M, N): "aux", (N,): "row", (1, N): "row", (M, 1): "col", (): "scalar"}[shape]
    assert roles == [want]


def test_batched_with_broadcast_B_equals_per_batch_gemm():
    A, B = operands(M, N, K, L=L, batched_b=False, seed=27)
    got = evt.gemm(A, B, lambda acc: acc)
    assert got.shape == (L, M, N)
    for i in range(L):
        torch.testing.assert_close(got[i], A[i] @ B, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------------ views on acc / outputs
OUTPUT_VIEWS = [
    ("acc", lambda acc: acc, False),
    ("T", lambda acc: acc.T, False),
    ("t()", lambda acc: acc.t(), False),
    ("transpose(-1, -2)", lambda acc: torch.relu(acc).transpose(-1, -2), False),
    ("mT", lambda acc: acc.mT, False),
    ("permute", lambda acc: acc.permute(1, 0), False),
    ("reshape(-1)", lambda acc: acc.reshape(-1), False),
    ("view(M*N)", lambda acc: acc.view(M * N), False),
    ("flatten", lambda acc: torch.flatten(acc), False),
    ("split back", lambda acc: acc.reshape(-1).reshape(M, N), False),
    ("unsqueeze(0)", lambda acc: acc.unsqueeze(0), False),
    ("unsqueeze(-1)", lambda acc: acc.unsqueeze(-1), False),
    ("[:, None]", lambda acc: acc[:, None], False),
    ("[None, ..., None]", lambda acc: acc[None, ..., None], False),
    ("expand", lambda acc: acc.unsqueeze(0).expand(2, M, N), False),
    ("T of intermediate", lambda acc: (acc.T * 2 + 1).T.sigmoid(), False),
    ("batched permute(0,2,1)", lambda acc: acc.permute(0, 2, 1), True),
    ("batched permute(2,0,1)", lambda acc: acc.permute(2, 0, 1), True),
    ("batched permute(1,2,0)", lambda acc: acc.permute(1, 2, 0), True),
    ("batched transpose(0,1)", lambda acc: acc.transpose(0, 1), True),
    ("batched mT", lambda acc: acc.mT, True),
    ("batched merge L*M", lambda acc: acc.reshape(L * M, N), True),
    ("batched merge M*N", lambda acc: acc.reshape(L, M * N), True),
    ("batched flatten(0, 1)", lambda acc: acc.flatten(0, 1), True),
    ("batched flatten(1)", lambda acc: acc.flatten(1), True),
    ("batched flatten all", lambda acc: acc.flatten(), True),
    ("batched merge then T", lambda acc: acc.reshape(L * M, N).T, True),
    ("batched merge split", lambda acc: acc.reshape(L * M, N).reshape(L, M, N), True),
    ("batched squeeze-free unsqueeze", lambda acc: acc.unsqueeze(1), True),
    ("batched transpose then merge M*L", lambda acc: acc.transpose(0, 1).reshape(M, L * N)[None], True),
]


@pytest.mark.parametrize("name, fn, batched", OUTPUT_VIEWS, ids=[c[0] for c in OUTPUT_VIEWS])
def test_output_views(name, fn, batched):
    """Returned views come back as the same strided view of a dense result, as eager returns them."""
    if name == "batched transpose then merge M*L":
        # (M, L, N) -> (M, L*N): L and N are not adjacent in (L, M, N) memory: needs a copy (see test below)
        A, B = operands(M, N, K, L=L, seed=28)
        with pytest.raises(evt.ShapeError, match="output 0"):
            evt.gemm(A, B, fn)
        return
    A, B = operands(M, N, K, L=L if batched else None, seed=28)
    got = check_gemm(fn, A, B)
    want = fn(eager_acc(A, B))
    for size, gs, ws in zip(got.shape, got.stride(), want.stride()):
        if size > 1:
            assert (gs == 0) == (ws == 0), f"{name}: strides {got.stride()} vs eager {want.stride()}"
    if want.is_contiguous():
        assert got.is_contiguous()
    elif "T" in name or "permute" in name or "transpose" in name or "mT" in name:
        assert got.stride() == want.stride(), f"{name}: a transposed output is a transposed view, like eager"


RETURN_CONVENTIONS = [
    ("list", lambda acc, C: [acc + C, (acc * C).sum(1)]),
    ("list of one", lambda acc, C: [acc.T * C.T]),
    ("tuple", lambda acc, C: (acc + C, acc.amax(0))),
    ("tuple of one", lambda acc, C: (acc - C,)),
    ("tensor", lambda acc, C: acc * C),
]


@pytest.mark.interpreter
@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("name, fn", RETURN_CONVENTIONS, ids=[c[0] for c in RETURN_CONVENTIONS])
def test_results_keep_the_epilogues_return_container(name, fn, backend):
    """A list comes back a list, a tuple a tuple, a tensor a tensor, as eager returns them (a list came back as a
    tuple, found by a probe): evt.gemm (first and cached calls), the differentiable path, outputs= pruning and
    Epilogue.reference."""
    A, B = operands(M, N, K, seed=66)
    C = rand((M, N), seed=67)
    want = fn(eager_acc(A, B), C)
    for _ in range(2):  # the second call goes through the prepared launch
        got = evt.gemm(A, B, fn, C=C, backend=backend)
        assert type(got) is type(want), f"{name}: {type(got).__name__}, eager {type(want).__name__}"
        check_gemm(fn, A, B, runner=_runner(backend), C=C)
    Ag, Cg = A.clone().requires_grad_(), C.clone().requires_grad_()
    got = evt.gemm(Ag, B, fn, C=Cg, backend=backend)
    assert type(got) is type(want)
    for g, w in zip(got if isinstance(got, (tuple, list)) else [got], want if isinstance(want, (tuple, list)) else [want]):
        torch.testing.assert_close(g.float(), w, rtol=1e-4, atol=1e-4)
    if isinstance(want, (tuple, list)):
        pruned = evt.gemm(A, B, fn, C=C, backend=backend, outputs=0)
        assert type(pruned) is type(want) and len(pruned) == len(want) and all(x is None for x in pruned[1:])
    ep = evt.trace(fn, acc=eager_acc(A, B), C=C)
    assert type(ep.reference(eager_acc(A, B), C=C)) is type(want)


CONTIGUOUS_OUTPUTS = [
    ("T.contiguous()", lambda acc: acc.T.contiguous(), False),
    ("t().contiguous() * 2 + 1", lambda acc: acc.t().contiguous() * 2 + 1, False),
    ("number + T.contiguous()", lambda acc: 0.5 + acc.T.contiguous(), False),
    ("T * T.contiguous() (first operand's layout)", lambda acc: acc.T * acc.T.contiguous(), False),
    ("T.contiguous() and T", lambda acc: [acc.T.contiguous(), acc.T], False),
    ("T.contiguous().reshape(-1)", lambda acc: acc.T.contiguous().reshape(-1), False),
    ("T.contiguous() expanded after", lambda acc: acc.T.contiguous()[None].expand(2, N, M), False),
    ("clone(contiguous_format)", lambda acc: acc.T.clone(memory_format=torch.contiguous_format), False),
    ("clone() keeps the layout", lambda acc: torch.clone(acc.T), False),
    ("zeros_like of T.contiguous()", lambda acc: torch.zeros_like(acc.T.contiguous()) + acc.T, False),
    ("contiguous() of acc", lambda acc: acc.contiguous(), False),
    ("ones_like(acc).T.contiguous()", lambda acc: (acc, torch.ones_like(acc).T.contiguous() * 2), False),
    ("batched permute(2, 0, 1).contiguous()", lambda acc: acc.permute(2, 0, 1).contiguous(), True),
    ("batched mT.contiguous()", lambda acc: torch.relu(acc.mT.contiguous()), True),
    ("batched transpose(0, 1).contiguous() merged", lambda acc: acc.transpose(0, 1).contiguous().reshape(M, L * N),
     True),
]


@pytest.mark.interpreter
@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("name, fn, batched", CONTIGUOUS_OUTPUTS, ids=[c[0] for c in CONTIGUOUS_OUTPUTS])
def test_contiguous_outputs_are_contiguous(name, fn, batched, backend):
    """``.contiguous()`` lays a value out row-major in its own dims, and an output keeps that layout: its base is
    stored in that order (``acc.T.contiguous()`` came back as a transposed view, found by a probe). Views taken
    afterwards are views of that layout (a merge that needed a copy of ``acc.T`` is one of ``acc.T.contiguous()``);
    elementwise results take the layout of their first full-size operand, as eager's. Also on the differentiable
    path (its outputs are laid out outside the operator)."""
    A, B = operands(M, N, K, L=L if batched else None, seed=68)
    for grad in (False, True):
        A_ = A.clone().requires_grad_(grad)
        got = check_gemm(fn, A_, B, runner=_runner(backend))
        want = fn(eager_acc(A_, B))
        for g, w in zip(got if isinstance(got, (tuple, list)) else [got],
                        want if isinstance(want, (tuple, list)) else [want]):
            assert g.is_contiguous() == w.is_contiguous(), f"{name}: strides {g.stride()} vs eager {w.stride()}"
            assert [s for s, n in zip(g.stride(), g.shape) if n > 1] == \
                [s for s, n in zip(w.stride(), w.shape) if n > 1], f"{name}: strides {g.stride()} vs eager {w.stride()}"


@pytest.mark.interpreter
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_contiguous_of_a_value_of_inputs_alone(backend):
    """``.contiguous()`` of a value computed from inputs alone: its dims' axes are known once it is bound, and the
    output is laid out in them then."""
    A, B = operands(M, N, K, seed=70)
    C = rand((M, N), seed=71)
    for fn in (lambda acc, C: (acc, C.T.contiguous() * 2), lambda acc, C: (acc, (C * 2).T.contiguous() + 1)):
        got = check_gemm(fn, A, B, runner=_runner(backend), C=C)
        assert got[1].is_contiguous() and got[1].shape == (N, M)


def test_contiguous_memory_formats_other_than_row_major_are_refused_by_name():
    A, B = operands(M, N, K, seed=69)
    with pytest.raises(evt.UnsupportedOpError, match=r"contiguous\(memory_format=torch.channels_last\) is not "
                                                     r"supported; expected torch.contiguous_format"):
        evt.gemm(A, B, lambda acc: acc[None, None].contiguous(memory_format=torch.channels_last))
    with pytest.raises(evt.UnsupportedOpError, match=r"clone\(memory_format=torch.channels_last\).*contiguous_format "
                                                     r"or torch.preserve_format"):
        evt.gemm(A, B, lambda acc: acc[None, None].clone(memory_format=torch.channels_last))
    with pytest.raises(evt.EpilogueTypeError, match=r"contiguous\(memory_format=torch.preserve_format\) is not "
                                                    "supported"):
        evt.gemm(A, B, lambda acc: acc.T.contiguous(memory_format=torch.preserve_format))
    with pytest.raises(evt.UnsupportedOpError, match=r"contiguous\(\) of \(2, M, N\), an expanded value"):
        evt.gemm(A, B, lambda acc: acc[None].expand(2, M, N).contiguous())


def test_output_views_of_size_one_axes():
    """Merging dims where some iteration axis has size 1 (L == 1, M == 1) is still one stride."""
    cases = [((1, 4), None, lambda acc: acc.T.reshape(-1)), ((M, 1), None, lambda acc: acc.T.reshape(-1)),
             ((1, 4), 3, lambda acc: acc.permute(1, 0, 2).reshape(-1)),
             ((1, 4), 3, lambda acc: acc.permute(0, 2, 1).reshape(3, -1)),
             ((M, N), 1, lambda acc: acc.transpose(0, 1).reshape(M, N))]
    for (m, n), l_, fn in cases:
        A, B = operands(m, n, K, L=l_, seed=29)
        check_gemm(fn, A, B)


def test_view_that_needs_a_copy_is_an_error_naming_it():
    A, B = operands(M, N, K, seed=30)
    with pytest.raises(evt.ShapeError, match=r"output 1 .*N\*M.*copy"):
        evt.gemm(A, B, lambda acc: (acc, acc.T.reshape(-1)))
    AL, BL = operands(M, N, K, L=L, seed=31)
    with pytest.raises(evt.ShapeError, match=r"output 0 .*L\*N.*copy"):
        evt.gemm(AL, BL, lambda acc: acc.permute(1, 0, 2).reshape(M, L * N))
    # a size-1 axis between two others does not make their merge contiguous: (L, 1, N) -> (N, 1, L) -> flat
    A1, B1 = operands(1, 4, K, L=L, seed=31)
    with pytest.raises(evt.ShapeError, match=r"output 0 .*N\*M\*L.*copy"):
        evt.gemm(A1, B1, lambda acc: acc.permute(2, 1, 0).reshape(-1))
    # the same merge inside the computation (not returned) needs no memory layout and is fine
    check_gemm(lambda acc: (acc.T.reshape(-1) * 2).reshape(N, M).T, A, B)


def test_reshape_splitting_inside_an_axis_is_refused_clearly():
    """Splitting M = 6 into (3, 2) needs per-element index arithmetic: deliberately refused, naming the reshape."""
    A, B = operands(M, N, K, seed=32)
    with pytest.raises(evt.ShapeError, match=r"reshape.*\(6, 5\) -> \(3, 2, 5\).*splits"):
        evt.gemm(A, B, lambda acc: acc.reshape(3, 2, 5))
    with pytest.raises(evt.ShapeError, match=r"reshape.*splits"):
        evt.gemm(A, B, lambda acc: acc.reshape(-1).reshape(2, 15))
    with pytest.raises(evt.ShapeError, match="invalid for a value of 30 elements"):
        evt.gemm(A, B, lambda acc: acc.reshape(7, 5))


def test_input_reshape_before_meeting_acc():
    """Reshapes that split or merge an input's dims are views of the input (per-axis strides), also before the
    input meets acc: the split parts / merged dims bind where eager broadcasting puts them."""
    AL, BL = operands(M, N, K, L=L, seed=33)
    A, B = operands(M, N, K, seed=33)
    cases = [
        (lambda acc, v: acc + v.reshape(1, 1, N), dict(v=rand((N,), seed=34))),
        (lambda acc, v: acc + v.reshape(L, 1, 1), dict(v=rand((L,), seed=34))),
        (lambda acc, C: acc + C.reshape(L, M, N), dict(C=rand((L * M, N), seed=35))),       # split L*M
        (lambda acc, C: acc * C.view(L, M, N), dict(C=rand((L, M * N), seed=35))),          # split M*N
        (lambda acc, C: acc + C.reshape(L, M, N), dict(C=rand((N, L * M), seed=35).t())),   # strided source
        (lambda acc, C: acc + C.reshape(M, L, N).permute(1, 0, 2), dict(C=rand((M * L, N), seed=36))),
        (lambda acc, C: acc.reshape(L * M, N) + C.reshape(L * M, N), dict(C=rand((L, M, N), seed=37))),  # merge
        (lambda acc, C: acc.flatten() * C.flatten(), dict(C=rand((L, M, N), seed=37))),
        (lambda acc, C, D: acc + (C + D).reshape(L, M, N), dict(C=rand((L * M, N), seed=38), D=rand((L * M, N)))),
        (lambda acc, v: (acc * v.reshape(L, M, 1)).sum(1), dict(v=rand((L * M,), seed=39))),
        (lambda acc, C: acc + C.reshape(L, M, N).reshape(L, 2, 3, N).reshape(L, M, N), dict(C=rand((L * M, N)))),
        (lambda acc, C: (acc, C.reshape(L, M, N) * 2), dict(C=rand((L * M, N), seed=40))),
    ]
    for fn, kw in cases:
        check_gemm(fn, AL, BL, **kw)
    check_gemm(lambda acc, C: acc + C.view(N, M).T, A, B, C=rand((N * M,), seed=41))
    ep = get_epilogue(cases[5][0], (L, M, N), torch.float32, cases[5][1])
    assert ep.graph.find("input", "C")[0].attrs["binding"] == (("M", "L"), ("N",))
    # the supported spelling from the other side still works: bring acc to the input's shape
    check_gemm(lambda acc, C: acc.reshape(L * M, N) + C, AL, BL, C=rand((L * M, N), seed=42))


@pytest.mark.interpreter
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_input_reshape_merging_dims_that_share_an_acc_axis(backend):
    """A reshape merging input dims that meet one acc axis together (an (M, 2, 3) input reshaped to (M, N = 6)):
    no input dim walks an axis of its own, so the run of dims is read as the one flat dim it is a view of. Was
    refused ("the merged input dims ... do not line up with the acc axes", found by a probe). Transposed, along
    M, over L and M, from strided sources (copied where the dims do not merge, as eager's reshape copies), and as
    the old refusal's (M, L) merged against acc's (L, M): element f is C's flat f, so a flat dim expresses it."""
    run = _runner(backend)
    A, B = operands(8, 6, K, seed=44)
    AL, BL = operands(M, N, K, L=L, seed=45)
    cases = [
        (A, B, lambda acc, C: acc + C.reshape(8, 6), {"C": rand((8, 2, 3), seed=46)}),
        (A, B, lambda acc, C: acc * C.view(8, -1), {"C": rand((8, 3, 2), seed=47)}),
        (A, B, lambda acc, C: acc + C.flatten(1), {"C": rand((8, 2, 1, 3), seed=48)}),  # a size-1 dim inside
        (A, B, lambda acc, C: acc + C.reshape(6, 8).T, {"C": rand((2, 3, 8), seed=49)}),        # transposed
        (A, B, lambda acc, C: acc - C.reshape(8, 6), {"C": rand((2, 4, 6), seed=50)}),          # along M
        (A, B, lambda acc, C: acc + C.reshape(8, 6), {"C": rand((8, 3, 2), seed=51).transpose(1, 2)}),  # copy
        (A, B, lambda acc, C: acc + C.reshape(8, 6), {"C": rand((16, 2, 3), seed=52)[::2]}),   # sliced: a view
        (A, B, lambda acc, C, D: acc + (C * D).reshape(8, 6), {"C": rand((8, 2, 3), seed=53),
                                                                 "D": rand((3, 2, 8), seed=54).permute(2, 1, 0)}),
        (A, B, lambda acc, C: (acc * C.reshape(8, 6)).sum(0), {"C": rand((8, 2, 3), seed=55)}),
        (A, B, lambda acc, C: (acc, acc * C.reshape(8, 2, 3).reshape(8, 6)), {"C": rand((8, 6), seed=56)}),
        (A, B, lambda acc, C: acc + C.reshape(2, 4, 6).reshape(8, 6), {"C": rand((8, 6), seed=57)}),
        (AL, BL, lambda acc, C: acc.reshape(L * M, N) + C.reshape(M * L, N), {"C": rand((M, L, N), seed=58)}),
        (AL, BL, lambda acc, C: acc + C.reshape(L, M, N), {"C": rand((L, 2, 3, N), seed=59)}),
        (AL, BL, lambda acc, C: acc.flatten() + C.reshape(-1), {"C": rand((2, L * M * N // 2), seed=60)}),
    ]
    for A_, B_, fn, kw in cases:
        check_gemm(fn, A_, B_, runner=run, **kw)
    ep = get_epilogue(cases[0][2], (8, 6), torch.float32, cases[0][3])
    assert ep.graph.find("input", "C")[0].attrs["binding"] == (("M",), ("*",), ("N",))


@pytest.mark.interpreter
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_input_reshape_merging_dims_differentiates(backend):
    """Gradients through such a reshape reach the input in its own shape (the differentiable path views inputs
    in canonical form with ``reshape``), also where the input's strides need the copy."""
    g = torch.Generator().manual_seed(61)
    A = torch.randn(8, K, generator=g, dtype=torch.float64, requires_grad=True)
    B = torch.randn(K, 6, generator=g, dtype=torch.float64)
    for C in (torch.randn(8, 2, 3, generator=g, dtype=torch.float64),
              torch.randn(8, 3, 2, generator=g, dtype=torch.float64).transpose(1, 2)):
        C = C.detach().requires_grad_()
        fn = lambda acc, C: torch.tanh(acc * C.reshape(8, 6))
        got = evt.gemm(A, B, fn, C=C, backend=backend)
        want = fn(A @ B, C)
        seed = torch.randn(want.shape, generator=g, dtype=torch.float64)
        torch.testing.assert_close(got, want)
        for x, y in zip(torch.autograd.grad(got, (A, C), seed), torch.autograd.grad(want, (A, C), seed)):
            torch.testing.assert_close(x, y)


def test_input_reshape_that_needs_index_arithmetic_is_refused():
    """Merges that are no view of the input are refused at trace time, naming the input: its dims merged out of
    order (a transpose first), an input broadcast along part of the merged dims, a part of a split dim merged
    with another dim."""
    A, B = operands(8, 6, K, seed=62)
    with pytest.raises(evt.ShapeError, match=r"input 'C'.*merges dims 2, 1 of input 'C'.*not adjacent dims in order"):
        evt.gemm(A, B, lambda acc, C: acc + C.transpose(1, 2).reshape(8, 6), C=rand((8, 3, 2)))
    with pytest.raises(evt.ShapeError, match=r"reads input 'v' with index arithmetic.*broadcast"):
        evt.gemm(A, B, lambda acc, C, v: acc + (C + v).reshape(8, 6), C=rand((8, 2, 3)), v=rand((3,)))
    A2, B2 = operands(16, 3, K, seed=63)
    with pytest.raises(evt.ShapeError, match=r"input 'C'.*merges C\.dim1\[part of 2\], a part of an input dim"):
        evt.gemm(A2, B2, lambda acc, C: acc + C.reshape(8, 2, 3).reshape(16, 3), C=rand((8, 6)))


def test_strided_input_that_cannot_merge_is_named_by_the_load():
    """``Epilogue.reference`` copies an input whose merged dims' strides do not merge, as evt.gemm does; the load's
    stride computation itself names the input and the fix where it meets one."""
    from evtorch.ir.layouts import input_axis_strides
    fn = lambda acc, C: acc + C.reshape(8, 6)
    C = rand((8, 3, 2), seed=64).transpose(1, 2)
    ep = evt.trace(fn, acc=evt.spec((8, 6)), C=C)
    acc = rand((8, 6), seed=65)
    torch.testing.assert_close(ep.reference(acc, C=C), fn(acc, C))
    with pytest.raises(evt.ShapeError, match=r"input 'C'.*dims 1\.\.2.*do not merge without a copy.*C\.contiguous"):
        input_axis_strides("C", C, ep.graph.find("input", "C")[0].attrs["binding"], {"L": 1, "M": 8, "N": 6})


def test_acc_combined_with_its_own_transpose_is_an_error():
    A, B = operands(N, N, K, seed=37)
    with pytest.raises(evt.ShapeError, match="different axes"):
        evt.gemm(A, B, lambda acc: acc + acc.T)


def test_views_on_inputs_batched():
    def fn(acc, C, D, r):
        return acc + C.permute(2, 0, 1) + D.transpose(1, 2) + r.unsqueeze(1), (acc * r[:, None, :]).sum(1)

    A, B = operands(M, N, K, L=L, seed=38)
    check_gemm(fn, A, B, C=rand((M, N, L), seed=39), D=rand((L, N, M), seed=40), r=rand((L, N), seed=41))


# ------------------------------------------------------------------------------------------------ scalars are runtime
def test_new_scalar_value_reuses_the_cached_epilogue():
    def fn(acc, C, alpha, beta, t):
        return torch.relu(alpha * acc + beta * C) * t

    A, B = operands(M, N, K, seed=42)
    C = rand((M, N), seed=43)
    kw = lambda a, b, t: dict(C=C, alpha=a, beta=b, t=torch.tensor(t))  # noqa: E731
    ep1 = get_epilogue(fn, (M, N), torch.float32, kw(1.5, 0.5, 2.0))
    before = _cached_epilogue.cache_info()
    outs = []
    for a, b, t in ((1.5, 0.5, 2.0), (-3.0, 7.25, 0.5), (0.0, 1.0, -1.0)):
        outs.append(check_gemm(fn, A, B, **kw(a, b, t)))
        assert get_epilogue(fn, (M, N), torch.float32, kw(a, b, t)) is ep1
    after = _cached_epilogue.cache_info()
    assert after.misses == before.misses, "a new scalar value must not retrace"
    assert after.hits > before.hits
    assert not torch.equal(outs[0], outs[1])  # the values really changed
    # an explicit Epilogue is reused as is for matching calls
    assert get_epilogue(ep1, (M, N), torch.float32, kw(9.0, 9.0, 9.0)) is ep1


def test_new_sizes_retrace_to_the_same_ir():
    fn = lambda acc, C, alpha: (alpha * acc + C, acc.sum(1))  # noqa: E731
    eps = [evt.trace(fn, acc=evt.spec((m, n)), C=evt.spec((m, n)), alpha=1.0) for m, n in ((8, 16), (33, 7))]
    assert eps[0].graph.structural_hash() == eps[1].graph.structural_hash()
    other = evt.trace(fn, acc=evt.spec((8, 16)), C=evt.spec((16,)), alpha=1.0)  # a row, not an aux: new IR
    assert other.graph.structural_hash() != eps[0].graph.structural_hash()


def test_scalar_kind_change_is_a_new_signature():
    """An int alpha and a float alpha promote differently (int * int stays int), so they trace separately."""
    fn = lambda acc, C, k: C * k  # noqa: E731
    A, B = operands(M, N, K, seed=44)
    C = rand_int((M, N), -3, 3, seed=45)
    assert check_gemm(fn, A, B, C=C, k=2).dtype == torch.int64
    assert check_gemm(fn, A, B, C=C, k=2.5).dtype == torch.float32


# ------------------------------------------------------------------------------------------------ indices
def test_row_and_col_index():
    def fn(acc):
        return evt.row_index(acc), evt.col_index(acc), acc * evt.row_index(acc) - evt.col_index(acc), \
            evt.col_index(acc.T)

    A, B = operands(M, N, K, seed=46)
    got = check_gemm(fn, A, B)
    assert got[0].dtype == torch.int64
    assert torch.equal(got[0], torch.arange(M)[:, None].expand(M, N))
    assert torch.equal(got[1], torch.arange(N).expand(M, N))
    assert torch.equal(got[3], torch.arange(M).expand(N, M))
    ep = evt.trace(fn, acc=evt.spec((M, N)))
    assert {n.target for n in ep.graph.find("index")} == {"M", "N"}


def test_indices_batched_and_on_real_tensors():
    A, B = operands(M, N, K, L=L, seed=47)
    fn = lambda acc: (evt.row_index(acc) * 100 + evt.col_index(acc)).float() + acc  # noqa: E731
    check_gemm(fn, A, B)
    x = torch.zeros(L, M, N)
    assert torch.equal(evt.row_index(x)[2, :, 0], torch.arange(M))
    assert torch.equal(evt.col_index(x)[1, 3], torch.arange(N))


def test_index_gather_with_integer_target():
    """The issue's gather: ``torch.where(evt.col_index(acc) == target[:, None], acc, 0).sum(1)``."""
    A, B = operands(M, N, K, seed=48)
    for dtype in (torch.int64, torch.int32):
        target = rand_int((M,), 0, N, seed=49, dtype=dtype)
        fn = lambda acc, target: torch.where(evt.col_index(acc) == target[:, None], acc, 0).sum(1)  # noqa: E731
        got = check_gemm(fn, A, B, target=target)
        acc = eager_acc(A, B)
        torch.testing.assert_close(got, acc[torch.arange(M), target.long()], rtol=0, atol=0)


def test_gemm_accepts_a_traced_epilogue():
    """``evt.gemm`` takes an ``Epilogue`` (from ``evt.trace`` with example tensors or ``evt.spec``) as is, and
    traces it again when the call's signature differs (other sizes, other input roles)."""
    def fn(acc, C, alpha):
        return torch.relu(alpha * acc + C), acc.sum(1)

    ep = evt.trace(fn, acc=evt.spec((M, N)), C=rand((M, N)), alpha=1.0)
    A, B = operands(M, N, K, seed=50)
    C = rand((M, N), seed=51)
    assert get_epilogue(ep, (M, N), torch.float32, dict(C=C, alpha=2.0)) is ep
    got = evt.gemm(A, B, ep, C=C, alpha=2.0)
    want = fn(eager_acc(A, B), C, 2.0)
    torch.testing.assert_close(got, want)
    A2, B2 = operands(2 * M, N + 3, K, seed=52)
    C2 = rand((N + 3,), seed=53)  # other sizes and a row instead of an aux
    got2 = evt.gemm(A2, B2, ep, C=C2, alpha=0.5)
    torch.testing.assert_close(got2, fn(eager_acc(A2, B2), C2, 0.5))
    ref = ep.reference(eager_acc(A, B), C=C, alpha=2.0)
    torch.testing.assert_close(ref, want)


@pytest.mark.interpreter
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_squeezing_a_size_one_axis_of_acc(backend):
    """``acc.squeeze(0)`` with M = 1 (``squeeze(1)`` with N = 1, ``squeeze()`` with both) drops the dim as
    ``reshape`` does: the triton backend crashed in the store ("Cannot broadcast ... (1) must match ... (16)") and
    the output was not seen as full-size (float32 where ``reshape`` gave A's dtype; found by a probe 2026-11-29)."""
    g = torch.Generator().manual_seed(2)
    for (M, N), fn in [((1, 6), lambda acc: acc.squeeze(0)), ((1, 6), lambda acc: acc.squeeze()),
                       ((5, 1), lambda acc: acc.squeeze(1)), ((5, 1), lambda acc: (acc.squeeze(-1), acc.sum(1))),
                       ((1, 1), lambda acc: (acc.squeeze(0), acc.sum())), ((1, 6), lambda acc: acc.T.squeeze(1) * 2)]:
        A, B = torch.randn(M, 4, generator=g, dtype=torch.float64), torch.randn(4, N, generator=g, dtype=torch.float64)
        got, want = evt.gemm(A, B, fn, backend=backend, out_dtype=torch.float32), fn(A @ B)
        got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
        for o, w in zip(got, want):
            assert o.shape == w.shape, (M, N, o.shape, w.shape)
            torch.testing.assert_close(o.double(), w, rtol=1e-6, atol=1e-6)
        assert got[0].dtype == torch.float32  # full-size: out_dtype, as reshape's
    A, B = torch.randn(1, 4, dtype=torch.float64), torch.randn(4, 1, dtype=torch.float64)
    for fn in (lambda acc: acc.squeeze(), lambda acc: acc.reshape(())):  # 0-d: a tile has no 0-d store
        with pytest.raises(evt.EpilogueError, match=r"0-d view of .* keep a dim \(.reshape\(1\)\) or reduce"):
            evt.gemm(A, B, fn, backend=backend)


# ------------------------------------------------------------------------------------------------ on a GPU
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(6, 10, 4), (512, 384, 256)], ids=["tiny", "tma"])
def test_gpu_contiguous_outputs_lists_and_merged_inputs(dtype, shape, monkeypatch):
    """The frontend fixes of 2026-11-29 on the device's templates (the larger shape takes the Hopper kernels, whose
    TMA store is dropped for an output laid out in its own order): outputs made ``.contiguous()`` come back
    contiguous with eager's values, list results stay lists, inputs whose merged dims share an acc axis load as
    their flat view."""
    monkeypatch.setenv("EVTORCH_AUTOTUNE", "0")  # the heuristic's template: tuning each case took 327 s (H200)
    M, N, K = shape
    A, B = (t.cuda() for t in operands(M, N, K, dtype, seed=80))

    def run(A, B, fn, **kw):
        return evt.gemm(A, B, fn, **kw)

    for name, fn, batched in CONTIGUOUS_OUTPUTS:
        if batched or "expanded after" in name:  # those read the module's small M, N, L
            continue
        got, want = check_gemm(fn, A, B, runner=run), fn(eager_acc(A, B))
        for g, w in zip(got if isinstance(got, (tuple, list)) else [got],
                        want if isinstance(want, (tuple, list)) else [want]):
            assert g.is_contiguous() == w.is_contiguous() and g.shape == w.shape, name
        assert type(got) is type(want), name

    def merged(acc, C):
        return [acc + C.reshape(M, N), (acc * C.reshape(M, N)).sum(0)]

    C = rand((M, 2, N // 2), dtype, seed=81).cuda()
    got = check_gemm(merged, A, B, runner=run, C=C)
    assert isinstance(got, list)
    check_gemm(merged, A, B, runner=run, C=rand((M, N // 2, 2), dtype, seed=82).cuda().transpose(1, 2))  # a copy

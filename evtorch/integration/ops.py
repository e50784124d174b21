"""The ``torch.library`` operators: ``evtorch::gemm`` (forward) and ``evtorch::gemm_backward``.

Both take canonical tensors (``autodiff.canonical``) and a plan key naming a ``GradPlan`` registered here by
``lookup`` (the epilogue, shapes, dtypes, which inputs require grad and the options are all in the plan, so the
key is a constant to torch.compile)::

    evtorch::gemm(Tensor A, Tensor B, Tensor[] tensors, float[] scalars, str plan) -> Tensor[]
        the user's outputs (canonical), then what the plan saves for the backward
    evtorch::gemm_backward(Tensor? A, Tensor? B, Tensor[] tensors, Tensor[] saved, Tensor[] grads,
                           float[] scalars, SymInt[] sizes, str plan) -> Tensor[]
        dA (if A requires grad), dB (if B does), then the gradient of each canonical input that gets one

Each has a fake (meta) implementation computing output shapes from A's and B's (symbolic) sizes, so
``torch.compile`` and ``torch.library.opcheck`` see through them; ``evtorch::gemm`` has an autograd formula
(``register_autograd``) calling ``evtorch::gemm_backward``, whose own autograd formula raises: double backward
through a fused GEMM is not supported and says so.

The backward's execution: the backward passes are epilogues of a GEMM with an empty K loop (an
epilogue-only kernel over the (M, N) tiles; the accumulator, when needed, is loaded from the saved copy) or,
with ``policy="recompute"``, of ``A @ B`` itself; then ``dA = d(acc) @ Bᵀ`` and ``dB = Aᵀ @ d(acc)`` are evtorch
GEMMs, ``dB`` summed over the batch when a 2-D B was broadcast over a batched A, and each written in the
memory layout of its operand (``weight.t()`` gets a row-major weight gradient without a copy).
"""
from __future__ import annotations

import functools
import itertools
import operator
import threading
from dataclasses import dataclass

import torch
from torch import Tensor

from ..autodiff import GradPlan
from ..autodiff.canonical import canonical_shape
from ..errors import EpilogueError
from .dispatch import running_op

_lock = threading.Lock()
_plans: dict[str, "Entry"] = {}
_keys: dict[tuple, str] = {}
_counter = itertools.count()


@dataclass
class Entry:
    """A registered plan and the options of the calls it serves."""

    plan: GradPlan
    wrt_A: bool
    wrt_B: bool
    out_dtype: torch.dtype
    backend: str
    deterministic: bool
    allow_tf32: bool
    config: object
    scalar_types: tuple
    ab_dtype: torch.dtype   # dtype of A and B (after autocast)
    a_col: bool             # A / B column-major (x.t(), weight.t()): their gradients are made so too
    b_col: bool
    b_batched: bool

    @functools.cached_property
    def static(self) -> tuple:
        """What the Python wrapper needs, as constants: (key, input keys (name, binding), scalar names,
        outputs (position, dims), number of user outputs, returns_tuple, number of forward results)."""
        plan = self.plan
        return (tuple((k.name, k.binding) for k in plan.keys), tuple(s.name for _, s in plan.scalars),
                tuple((o.position, o.dims) for o in plan.outputs), len(plan.ep.outputs), plan.ep.returns_tuple,
                len(plan.forward_layout()))


def register(signature: tuple, build) -> str:
    """The key of the plan for ``signature``, building it with ``build()`` the first time."""
    key = _keys.get(signature)
    if key is not None:
        return key
    entry = build()
    with _lock:
        key = _keys.get(signature)
        if key is None:
            key = f"p{next(_counter)}"
            _plans[key] = entry
            _keys[signature] = key
    return key


def entry(key: str) -> Entry:
    try:
        return _plans[key]
    except KeyError:
        raise EpilogueError(f"evtorch::gemm: unknown plan {key!r}; plans live in the process that built them "
                            "(an exported graph calling evtorch ops must be run where evt.gemm traced them)") \
            from None


def _scalars(e: Entry, values) -> list:
    return [t(v) for t, v in zip(e.scalar_types, values)]


def _sizes(A: Tensor, B: Tensor) -> dict:
    return {"L": A.shape[0] if A.dim() == 3 else 1, "M": A.shape[-2], "N": B.shape[-1]}


def _no_autocast(device_type: str):
    return torch.autocast(device_type=device_type, enabled=False) if device_type in ("cpu", "cuda") else \
        _nullcontext()


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _run(A, B, epilogue, e: Entry, out_dtype, kw: dict, config=None):
    """One evtorch GEMM inside an operator. ``epilogue`` is an ``Epilogue`` built by the plan (None: identity);
    on the Triton backend it goes straight to the runtime when the call matches the signature it was traced
    for (evt.gemm's per-call checks and cache lookups cost more host time than the kernel at small sizes)."""
    from ..api import gemm
    with running_op(), _no_autocast(A.device.type):
        if e.backend == "triton":
            ep = epilogue if epilogue is not None else _identity_epilogue(A, B)
            if _matches(ep, A, B, kw):
                from ..runtime.gemm import run_gemm
                res = run_gemm(ep, A, B, kw, out_dtype=out_dtype, deterministic=e.deterministic,
                               allow_tf32=e.allow_tf32, config=config)
                return res if isinstance(res, tuple) else (res,)
        res = gemm(A, B, epilogue, out_dtype=out_dtype, backend=e.backend, deterministic=e.deterministic,
                   allow_tf32=e.allow_tf32, config=config, outputs=getattr(epilogue, "keep", None), **kw)
    return res if isinstance(res, tuple) else (res,)


_identities: dict = {}


def _identity_epilogue(A: Tensor, B: Tensor):
    from ..api import _identity
    from ..epilogue import Epilogue
    acc_shape = (A.shape[0], A.shape[-2], B.shape[-1]) if A.dim() == 3 else (A.shape[-2], B.shape[-1])
    acc_dtype = torch.float64 if A.dtype == torch.float64 else torch.float32
    key = (acc_shape, acc_dtype)
    if key not in _identities:
        _identities[key] = Epilogue(_identity, acc_shape, acc_dtype, [])
    return _identities[key]


def _matches(ep, A: Tensor, B: Tensor, kw: dict) -> bool:
    """Whether ``ep`` was traced for exactly these shapes and dtypes (else evt.gemm retraces)."""
    from ..api import check_operands
    L, M, N, _, batched = check_operands(A, B)
    acc_dtype = torch.float64 if A.dtype == torch.float64 else torch.float32
    if ep.acc_shape != ((L, M, N) if batched else (M, N)) or ep.acc_dtype != acc_dtype or \
            len(kw) != len(ep.input_specs):
        return False
    for spec in ep.input_specs:
        v = kw.get(spec.name)
        if spec.kind == "tensor":
            if not isinstance(v, Tensor) or tuple(v.shape) != spec.shape or v.dtype != spec.dtype:
                return False
        elif isinstance(v, Tensor) or v is None:
            return False
    return True


# ---------------------------------------------------------------------------------------------------- forward
def forward_impl(A: Tensor, B: Tensor, tensors: list[Tensor], scalars: list[float], plan: str) -> list[Tensor]:
    e = entry(plan)
    p = e.plan
    kw = {k.param: t for k, t in zip(p.keys, tensors)}
    kw.update({name: v for (name, _), v in zip(p.scalars, _scalars(e, scalars))})
    return list(_run(A, B, p.forward_epilogue, e, e.out_dtype, kw, e.config))


@torch.library.custom_op("evtorch::gemm", mutates_args=())
def gemm_op(A: Tensor, B: Tensor, tensors: list[Tensor], scalars: list[float], plan: str) -> list[Tensor]:
    return forward_impl(A, B, tensors, scalars, plan)


@gemm_op.register_fake
def _gemm_fake(A, B, tensors, scalars, plan):
    p = entry(plan).plan
    sizes = _sizes(A, B)
    return [A.new_empty(canonical_shape(axes, p.order, sizes), dtype=dtype) for axes, dtype in p.forward_layout()]


def _setup(ctx, inputs, output):
    A, B, tensors, scalars, plan = inputs
    e = entry(plan)
    p = e.plan
    ctx.plan, ctx.scalars = plan, scalars
    n_user = len(p.outputs)
    keep_A = e.wrt_B or p.mode == "recompute"
    keep_B = e.wrt_A or p.mode == "recompute"
    used = [t for k, t in zip(p.keys, tensors) if k.param in p.used_params]
    ctx.layout = (keep_A, keep_B, len(used), len(tensors))
    ctx.sizes = [A.shape[0] if A.dim() == 3 else 1, A.shape[-2], B.shape[-1], A.shape[-1]]
    ctx.save_for_backward(*([A] if keep_A else []), *([B] if keep_B else []), *used, *output[n_user:])
    ctx.set_materialize_grads(False)


def _backward(ctx, grads, backward=None):
    e = entry(ctx.plan)
    p = e.plan
    keep_A, keep_B, n_used, n_tensors = ctx.layout
    saved = list(ctx.saved_tensors)
    A = saved.pop(0) if keep_A else None
    B = saved.pop(0) if keep_B else None
    used, saved = saved[:n_used], saved[n_used:]
    seeds = [o.position for o, g in zip(p.outputs, grads) if g is not None and o.differentiable]
    no_scalars = None if ctx.scalars else []  # a float list is one leaf, an empty list none
    if not seeds:
        return None, None, [None] * n_tensors, no_scalars, None
    program = p.backward(tuple(seeds))
    key = f"{ctx.plan}|{','.join(map(str, seeds))}"
    present = [g for o, g in zip(p.outputs, grads) if o.position in seeds]
    res = list((backward or gemm_backward_op)(A, B, used, saved, present, ctx.scalars, ctx.sizes, key))
    dA = res.pop(0) if e.wrt_A and program.d_acc else None
    dB = res.pop(0) if e.wrt_B and program.d_acc else None
    by_param = dict(zip(program.grads, res))
    dtensors = [by_param[k.param].to(k.dtype) if k.param in by_param else None for k in p.keys]
    return dA, dB, dtensors, no_scalars, None


gemm_op.register_autograd(_backward, setup_context=_setup)


class FusedGemm(torch.autograd.Function):
    """The same forward and backward as ``evtorch::gemm`` for eager mode, without torch.library's per-call
    wrapping (a few hundred microseconds of Python per call; torch.compile uses the operator)."""

    @staticmethod
    def forward(ctx, A, B, scalars, plan, *tensors):
        out = forward_impl(A, B, list(tensors), scalars, plan)
        _setup(ctx, (A, B, list(tensors), scalars, plan), out)
        ctx.mark_non_differentiable(*out[len(entry(plan).plan.outputs):])
        return tuple(out)

    @staticmethod
    def backward(ctx, *grads):
        with torch.no_grad():
            dA, dB, dtensors, _, _ = _backward(ctx, list(grads), backward_impl)
        if torch.is_grad_enabled():  # create_graph=True: the gradients must refuse to be differentiated
            dA, dB, *dtensors = _no_double_backward(dA, dB, *dtensors)
        return (dA, dB, None, None, *dtensors)


class _NoDoubleBackward(torch.autograd.Function):
    """Identity on gradients made with create_graph=True whose own backward raises (the gradients of a fused
    GEMM are computed without a graph; without this they would silently be constants)."""

    @staticmethod
    def forward(ctx, anchor, *grads):
        return tuple(g.view_as(g) for g in grads)

    @staticmethod
    def backward(ctx, *_):
        _double_backward(ctx, _)


def _no_double_backward(*grads):
    present = [g for g in grads if g is not None]
    anchor = torch.empty(0, requires_grad=True)  # makes the outputs part of the graph
    wrapped = iter(_NoDoubleBackward.apply(anchor, *present)) if present else iter(())
    return [next(wrapped) if g is not None else None for g in grads]


# ---------------------------------------------------------------------------------------------------- backward
def col_major(t: Tensor) -> bool:
    """Whether a 2-D operand is column-major (``weight.t()``): its gradient is then produced column-major."""
    if t.dim() != 2:
        return False
    s0, s1 = operator.index(t.stride(0)), operator.index(t.stride(1))  # static under torch.compile
    return s0 == 1 and s1 != 1


def _matmul(X: Tensor, Y: Tensor, e: Entry, col_major: bool) -> Tensor:
    if col_major:
        return _matmul(Y.mT, X.mT, e, False).mT
    return _run(X, Y, None, e, X.dtype, {})[0]


def epilogue_only_config(device: torch.device):
    """The tile config of epilogue-only passes when not autotuning: a backward epilogue is long (the forward
    recomputed plus its derivative) and memory-bound, so small tiles (no spills) and many programs; None (the
    usual choice) on CPU and when autotuning, which then times the candidates."""
    from ..runtime import knobs
    if device.type != "cuda" or knobs.autotune_enabled():
        return None
    from ..codegen.configs import GemmConfig
    return GemmConfig("portable", 64, 64, 16, GROUP_M=8, num_warps=4, num_stages=1)


_constants: dict = {}


def _constant(value, dtype, device) -> Tensor:
    """A cached one-element tensor (no fill kernel per call); not cached while a CUDA graph is captured."""
    key = (value if value == value else "nan", dtype, str(device))
    t = _constants.get(key)
    if t is None:
        t = torch.full((1,), value, dtype=dtype, device=device)
        if not (t.is_cuda and torch.cuda.is_current_stream_capturing()):
            _constants[key] = t
    return t


def _empty_operands(A: Tensor, sizes: dict, batched: bool, dtype) -> tuple[Tensor, Tensor]:
    """Operands of an epilogue-only GEMM (K = 0): the template runs no K step and hands a zero accumulator
    to the epilogue. Backed by one element so no launcher ever sees a null pointer."""
    one = _constant(0, dtype, A.device)
    lead = (sizes["L"],) if batched else ()
    za = one.as_strided(lead + (sizes["M"], 0), (0,) * (len(lead) + 2))
    zb = one.as_strided(lead + (0, sizes["N"]), (0,) * (len(lead) + 2))
    return za, zb


def backward_impl(A: Tensor | None, B: Tensor | None, tensors: list[Tensor], saved: list[Tensor],
                  grads: list[Tensor], scalars: list[float], sizes: list[int], plan: str) -> list[Tensor]:
    key, seeds = plan.split("|")
    e = entry(key)
    p = e.plan
    seeds = tuple(int(s) for s in seeds.split(","))
    program = p.backward(seeds)
    ref = next(t for t in (A, B, *tensors, *saved, *grads) if t is not None)
    device = ref.device
    sizes = dict(zip("LMN", sizes))
    kw: dict = {}
    used = iter(tensors)
    for k in p.keys:
        shape = p.key_shape(k, sizes)
        # inputs the backward does not read were not kept; a NaN stand-in shows any mistake loudly
        kw[k.param] = next(used) if k.param in p.used_params else \
            _constant(float("nan") if k.dtype.is_floating_point else 0, k.dtype, device).view([1] * len(shape)) \
            .expand(shape)
    kw.update({name: v for (name, _), v in zip(p.scalars, _scalars(e, scalars))})
    kw.update({f"g{pos}": g for pos, g in zip(seeds, grads)})
    n_vec = len(p.saved_vectors)
    kw.update({f"v{i}": v for i, v in enumerate(saved[:n_vec])})
    if p.mode == "saved":
        kw["acc_s"] = saved[n_vec]
    gemm_dtype = e.ab_dtype
    batched = p.ep.batched
    if p.mode == "recompute":
        opA, opB, config = A, B, None
    else:
        opA, opB = _empty_operands(ref, sizes, batched, gemm_dtype)
        config = epilogue_only_config(ref.device)
    out_dtype = _backward_out_dtype(p, program)
    results: dict = {}
    for stage, ep in zip(program.passes, program.epilogues):
        outs = _run(opA, opB, ep, e, out_dtype, {x: kw[x] for x in stage.params}, config)
        (results if stage is program.passes[-1] else kw).update(zip(stage.outputs, outs))
    if program.d_acc_from is not None:
        results["d_acc"] = kw[program.d_acc_from]
    out = []
    if program.d_acc:
        d_acc = results["d_acc"].to(gemm_dtype)
        if e.wrt_A:
            out.append(_matmul(d_acc, B.mT, e, e.a_col))
        if e.wrt_B:
            if batched and not e.b_batched:  # B broadcast over the batch: its gradient sums over L
                L, M, K = A.shape
                out.append(_matmul(A.reshape(L * M, K).mT, d_acc.reshape(L * M, -1), e, e.b_col))
            else:
                out.append(_matmul(A.mT, d_acc, e, e.b_col))
    for param in program.grads:
        k = next(k for k in p.keys if k.param == param)
        g = results[param]
        out.append(g.reshape(()) if k.binding == () and len(g.shape) else g)
    return out


def _backward_out_dtype(p: GradPlan, program) -> torch.dtype:
    """Full-size results of the backward epilogue (d(acc), aux-input gradients) are stored in the output dtype,
    unless an aux input needing a gradient is more precise (fp32 C with bf16 A and B): then in fp32."""
    if p.ep.acc_dtype == torch.float64:
        return torch.float64
    wide = any(k.param in program.grads and {"M", "N"} <= set(k.axes) and k.dtype.is_floating_point
               and torch.finfo(k.dtype).bits > torch.finfo(p.out_dtype).bits for k in p.keys)
    return torch.float32 if wide else p.out_dtype


def grad_dtypes(p: GradPlan, program) -> dict:
    """param -> dtype of the gradient the backward epilogue produces for it."""
    if not program.epilogues:
        return {}
    main = program.epilogues[-1]
    out_dtype = _backward_out_dtype(p, program)
    names = program.passes[-1].outputs
    return {name: main.output_dtype(o, out_dtype) for name, o in zip(names, main.outputs)}


@torch.library.custom_op("evtorch::gemm_backward", mutates_args=())
def gemm_backward_op(A: Tensor | None, B: Tensor | None, tensors: list[Tensor], saved: list[Tensor],
                     grads: list[Tensor], scalars: list[float], sizes: list[int], plan: str) -> list[Tensor]:
    return backward_impl(A, B, tensors, saved, grads, scalars, sizes, plan)


@gemm_backward_op.register_fake
def _gemm_backward_fake(A, B, tensors, saved, grads, scalars, sizes, plan):
    key, seeds = plan.split("|")
    e = entry(key)
    p = e.plan
    program = p.backward(tuple(int(s) for s in seeds.split(",")))
    ref = next(t for t in (A, B, *tensors, *saved, *grads) if t is not None)
    L, M, N, K = sizes
    lead = [L] if p.ep.batched else []
    out = []
    if program.d_acc:
        for wrt, col, shape in ((e.wrt_A, e.a_col, lead + [M, K]),
                                (e.wrt_B, e.b_col, (lead if e.b_batched else []) + [K, N])):
            if wrt:
                out.append(ref.new_empty(shape[::-1], dtype=e.ab_dtype).mT if col else
                           ref.new_empty(shape, dtype=e.ab_dtype))
    dtypes = grad_dtypes(p, program)
    for param in program.grads:
        k = next(k for k in p.keys if k.param == param)
        out.append(ref.new_empty(p.key_shape(k, dict(zip("LMN", sizes))), dtype=dtypes[param]))
    return out


def _double_backward(ctx, grads):
    raise EpilogueError("double backward through evt.gemm is not supported: the backward of a fused GEMM is "
                        "itself fused and has no derivative. Compute higher-order gradients with the eager "
                        "epilogue (fn(A @ B, **inputs)) instead")


gemm_backward_op.register_autograd(_double_backward, setup_context=lambda ctx, inputs, output: None)

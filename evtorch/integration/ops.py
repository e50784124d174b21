"""The ``torch.library`` operators: ``evtorch::gemm`` (forward) and ``evtorch::gemm_backward``.

Both take canonical tensors (``autodiff.canonical``) and a plan key naming a ``GradPlan`` registered here by
``lookup`` (the epilogue, shapes, dtypes, which inputs require grad and the options are all in the plan, so the
key is a constant to torch.compile)::

    evtorch::gemm(Tensor A, Tensor B, Tensor[] tensors, float[] scalars, SymInt[] ints, str plan) -> Tensor[]
        the user's outputs (canonical), then what the plan saves for the backward
    evtorch::gemm_backward(Tensor? A, Tensor? B, Tensor[] tensors, Tensor[] saved, Tensor[] grads,
                           float[] scalars, SymInt[] ints, SymInt[] sizes, str plan) -> Tensor[]
        dA (if A requires grad), dB (if B does), then the gradient of each canonical input that gets one

The number inputs travel in two lists, the integers in ``ints`` and the others (floats, bools) in ``scalars``,
each in the plan's order (``merge_scalars`` makes the one list the implementations take): a ``SymInt[]`` keeps a
Dynamo-symbolic int symbolic, where the single ``float[]`` of before guarded on each value (every new int
recompiled; found by a probe 2026-11-29); a ``Scalar[]`` would too, but torch.export cannot save one that is empty
or mixes ints and floats.

Each has a fake (meta) implementation computing output shapes from A's and B's (symbolic) sizes, so
``torch.compile`` and ``torch.library.opcheck`` see through them; ``evtorch::gemm``'s autograd kernel records
an autograd node (``_GemmOp``) whose backward calls ``evtorch::gemm_backward``, whose own results refuse to be
differentiated: double backward through a fused GEMM is not supported and says so. (Why ``torch.library.Library``
and kernels of our own rather than ``torch.library.custom_op``: at ``_lib`` below.)

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
import secrets
import threading
from dataclasses import dataclass

import torch
from torch import Tensor
# torch-internal since 2.0; torch.export and make_fx rely on it themselves
from torch.utils._python_dispatch import _disable_current_modes

from ..autodiff import GradPlan
from ..autodiff.canonical import apply_step, canonical_shape
from ..epilogue import pack_results
from ..errors import EpilogueError
from ..runtime import knobs
from ..runtime.pools import keepable
from .deferred import DeferredGrad, producer
from .deferred import enabled as deferred_enabled
from .deferred import mode as deferred_mode
from .dispatch import running_op
from .nodouble import refuse_double_backward

_lock = threading.Lock()
_plans: dict[str, "Entry"] = {}
_keys: dict[tuple, str] = {}
_counter = itertools.count()
#: plan keys carry this process's token: a program exported in one process and run in another names plans of the
#: first, and a bare counter ("p0") could name a different plan of the second, a silently wrong result
_PROCESS = secrets.token_hex(4)


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
    #: wrt (A, B, input names) -> the key of the same call's plan differentiating those leaves
    #: (``function.plan_key``; see ``covering``)
    widen: object

    @functools.cached_property
    def names(self) -> tuple:
        """The user's input name of each canonical input (``tensors`` of the operator), in order."""
        return tuple(k.name for k in self.plan.keys)

    def covering(self, key: str, A: Tensor, B: Tensor, tensors) -> str:
        """The key of a plan that differentiates every leaf of this call requiring grad: ``key`` itself, or the
        plan of the same call with the missing leaves added.

        A program that names a plan by key (``torch.export``'s graph, a direct operator call) was traced with
        example inputs whose ``requires_grad`` decided which gradients the plan computes; run with other inputs
        (an exported module trained, its input coming from a layer that requires grad, or a program exported under
        ``torch.no_grad``), the plan would return no gradient for those leaves: parameters left without
        ``.grad``, layers upstream without a gradient, silently. Eager calls and torch.compile key or guard on
        ``requires_grad`` and never get here with a leaf missing."""
        p = self.plan
        want_A = self.wrt_A or A.requires_grad
        want_B = self.wrt_B or B.requires_grad
        extra = frozenset(name for name, t in zip(self.names, tensors)
                          if t.requires_grad and name not in p.wrt_inputs)
        if want_A == self.wrt_A and want_B == self.wrt_B and not extra:
            return key
        return self.widen((want_A, want_B, p.wrt_inputs | extra))

    @functools.cached_property
    def static(self) -> tuple:
        """What the Python wrapper needs, as constants: (key, input keys (name, binding), scalar names,
        outputs (position, dims, layout), number of user outputs, return convention (``Epilogue.returns``), number of
        forward results)."""
        plan = self.plan
        return (tuple((k.name, k.binding) for k in plan.keys), tuple(s.name for _, s in plan.scalars),
                tuple((o.position, o.dims, o.layout) for o in plan.outputs), len(plan.ep.outputs), plan.ep.returns,
                len(plan.forward_layout()))

    @functools.cached_property
    def saves(self) -> tuple:
        """What the forward keeps for the backward: (A, B, indexes of the canonical inputs the backward reads,
        number of user outputs; the forward's results after them are saved too)."""
        p = self.plan
        used = tuple(i for i, k in enumerate(p.keys) if k.param in p.used_params)
        return self.wrt_B or p.mode == "recompute", self.wrt_A or p.mode == "recompute", used, len(p.outputs)


def register(signature: tuple, build) -> str:
    """The key of the plan for ``signature``, building it with ``build()`` the first time.

    ``build`` runs with the tracing modes of whoever called (torch.export's non-strict tracer, make_fx) set aside:
    tracing the epilogue runs aten ops on meta tensors, and a tracer would record them into the traced graph as
    dead nodes (about 170 for a GELU ``evt.linear`` under ``torch.export.export``, which ``ep.module()`` then ran on
    every call). A plan is a constant of the traced program, not part of it."""
    key = _keys.get(signature)
    if key is not None:
        return key
    with _disable_current_modes():
        entry = build()
    with _lock:
        key = _keys.get(signature)
        if key is None:
            key = f"p{next(_counter)}_{_PROCESS}"
            _plans[key] = entry
            _keys[signature] = key
    return key


def entry(key: str) -> Entry:
    try:
        return _plans[key]
    except KeyError:
        raise EpilogueError(f"evtorch::gemm: unknown plan {key!r}; plans live in the process that traced them "
                            f"(this one's keys end in _{_PROCESS}): run an exported program where it was exported, "
                            "or export it again in this process") from None


def _scalars(e: Entry, values) -> list:
    return [t(v) for t, v in zip(e.scalar_types, values)]


def merge_scalars(e: Entry, floats, ints) -> list:
    """The runtime scalars of ``e``'s plan in its order, from the operators' two lists (module docstring)."""
    if not ints:
        return floats
    floats, ints = iter(floats), iter(ints)
    return [next(ints) if t is int else next(floats) for t in e.scalar_types]


def split_scalars(e: Entry, values) -> tuple[list, list]:
    """``merge_scalars``' inverse: (floats, ints) of the plan's runtime scalars ``values``."""
    if int not in e.scalar_types:
        return list(values), []
    return ([float(v) for t, v in zip(e.scalar_types, values) if t is not int],
            [v for t, v in zip(e.scalar_types, values) if t is int])


def _scalar_kinds(e: Entry) -> list:
    """(parameter, type) of each runtime scalar of ``e``'s plan: how a float from the scalar list is passed."""
    return list(zip([param for param, _ in e.plan.scalars], e.scalar_types))


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
    for (evt.gemm's per-call checks and cache lookups cost more host time than the kernel at small sizes).

    A signature that ran before launches through its ``LaunchSite`` outside ``running_op`` and the autocast
    guard: a launch runs no torch op either could change, and the two context managers cost 10-20 us of host time
    per call (four calls per forward + backward under torch.compile)."""
    if e.backend == "triton":
        ep = epilogue if epilogue is not None else _identity_epilogue(A, B)
        # the operators' bodies (torch.compile, opcheck) have no EagerCall: a LaunchSite per full signature
        key = (ep, out_dtype, e.deterministic, e.allow_tf32, config, _signature(A), _signature(B),
               *[(name, _signature(v) if isinstance(v, Tensor) else type(v)) for name, v in kw.items()])
        site = _op_sites.get(key)
        if site is not None:
            res = site.run(ep, A, B, kw, out_dtype, e.deterministic, e.allow_tf32, config)
            if res is not None:
                return _as_tuple(res)
    from ..api import gemm
    with running_op(), _no_autocast(A.device.type):
        if e.backend == "triton" and _matches(ep, A, B, kw):
            from ..runtime.gemm import LaunchSite, run_gemm
            res = run_gemm(ep, A, B, kw, out_dtype=out_dtype, deterministic=e.deterministic,
                           allow_tf32=e.allow_tf32, config=config)
            if site is None:
                if len(_op_sites) >= 256:
                    _op_sites.clear()
                _op_sites[key] = LaunchSite()
            return _as_tuple(res)
        res = gemm(A, B, epilogue, out_dtype=out_dtype, backend=e.backend, deterministic=e.deterministic,
                   allow_tf32=e.allow_tf32, config=config, outputs=getattr(epilogue, "keep", None), **kw)
    return _as_tuple(res)


_op_sites: dict = {}


def _as_tuple(res) -> tuple:
    """An epilogue's results as the operator returns them, a tuple: one tensor, or a tuple or list of them (the
    public wrappers give the epilogue's own convention back, ``pack_results``)."""
    return tuple(res) if isinstance(res, (tuple, list)) else (res,)


def _signature(t: Tensor) -> tuple:
    return t.shape, t.stride(), t.dtype, t.device


def _launch(site, A, B, ep, e: Entry, out_dtype, kw: dict, config=None) -> tuple:
    """``_run`` of an ``Epilogue`` at a ``runtime.gemm.LaunchSite`` of an eager call (None on the reference
    backend): for a signature that ran before, straight to its prepared launch (allocation, launch). The first
    call of a signature goes through ``_run`` (its checks, the retracing fallback), which prepares the launch."""
    if site is not None:
        res = site.run(ep, A, B, kw, out_dtype, e.deterministic, e.allow_tf32, config)
        if res is not None:
            return _as_tuple(res)
    return _run(A, B, ep, e, out_dtype, kw, config)


def _site(e: Entry):
    """A new LaunchSite for an eager call of ``e`` (None on the reference backend)."""
    if e.backend != "triton":
        return None
    from ..runtime.gemm import LaunchSite
    return LaunchSite()


_identities: dict = {}


def _identity_epilogue(A: Tensor, B: Tensor):
    from ..api import _identity
    from ..epilogue import Epilogue
    acc_shape = (A.shape[0], A.shape[-2], B.shape[-1]) if A.dim() == 3 else (A.shape[-2], B.shape[-1])
    acc_dtype = torch.float64 if A.dtype == torch.float64 else torch.float32
    key = (acc_shape, acc_dtype)
    ep = _identities.get(key)
    if ep is None:
        with running_op(), _no_autocast(A.device.type):
            ep = _identities[key] = Epilogue(_identity, acc_shape, acc_dtype, [], intermediates="eager")
    return ep


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
def forward_impl(A: Tensor, B: Tensor, tensors: list[Tensor], scalars: list[float], ints: list[int],
                 plan: str) -> list[Tensor]:
    e = entry(plan)
    p = e.plan
    kw = {k.param: t for k, t in zip(p.keys, tensors)}
    kw.update({name: v for (name, _), v in zip(p.scalars, _scalars(e, merge_scalars(e, scalars, ints)))})
    return list(_run(A, B, p.forward_epilogue, e, e.out_dtype, kw, e.config))


# The operators are declared with ``torch.library.Library`` and given their autograd kernel here, not made by
# ``torch.library.custom_op``: custom_op wraps every call in two Python layers (its autograd kernel's pytree
# handling and its backend wrapper's output-aliasing check), 21 us a call on this project's 2-core CPU machine
# against 11 us for the kernels below (a bare ``Library`` kernel: 7 us; the operator body itself: 2 us). A compiled
# training step calls both operators on every step, inside AOTAutograd's runtime, where no input requires grad:
# the autograd kernel's first line sends such calls straight to the implementation.
_lib = torch.library.Library("evtorch", "DEF")
_lib.define("gemm(Tensor A, Tensor B, Tensor[] tensors, float[] scalars, SymInt[] ints, str plan) -> Tensor[]",
            tags=(torch.Tag.pt2_compliant_tag,))
_lib.define("gemm_backward(Tensor? A, Tensor? B, Tensor[] tensors, Tensor[] saved, Tensor[] grads, "
            "float[] scalars, SymInt[] ints, SymInt[] sizes, str plan) -> Tensor[]",
            tags=(torch.Tag.pt2_compliant_tag,))
gemm_op = torch.ops.evtorch.gemm.default
gemm_backward_op = torch.ops.evtorch.gemm_backward.default
_lib.impl("gemm", lambda A, B, tensors, scalars, ints, plan: forward_impl(A, B, tensors, scalars, ints, plan),
          "CompositeExplicitAutograd")  # (looked up per call, so that a test can wrap forward_impl)


def _gemm_fake(A, B, tensors, scalars, ints, plan):
    p = entry(plan).plan
    sizes = _sizes(A, B)
    return [A.new_empty(canonical_shape(axes, p.order, sizes), dtype=dtype) for axes, dtype in p.forward_layout()]


torch.library.register_fake("evtorch::gemm", _gemm_fake, lib=_lib)


def _requires_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _gemm_autograd(A, B, tensors, scalars, ints, plan):
    """``evtorch::gemm``'s autograd kernel: the operator recorded as one ``_GemmOp`` node where an input requires
    grad (torch.compile's tracing of the step), else straight on to the implementation (the compiled step)."""
    if _requires_grad(A, B, *tensors):
        plan = entry(plan).covering(plan, A, B, tensors)
        return list(_GemmOp.apply(A, B, scalars, ints, plan, *tensors))
    with torch._C._AutoDispatchBelowAutograd():
        return gemm_op(A, B, tensors, scalars, ints, plan)


class _GemmOp(torch.autograd.Function):
    """``evtorch::gemm`` under autograd: the forward below autograd, what ``_setup`` saves, ``_backward``."""

    @staticmethod
    def forward(ctx, A, B, scalars, ints, plan, *tensors):
        with torch._C._AutoDispatchBelowAutograd():
            out = gemm_op(A, B, list(tensors), scalars, ints, plan)
        _setup(ctx, (A, B, tensors, scalars, ints, plan), out)
        quiet = [out[i] for i in entry(plan).plan.independent]  # as FusedGemm: eager's requires_grad
        if quiet:
            ctx.mark_non_differentiable(*quiet)
        return tuple(out)

    @staticmethod
    def backward(ctx, *grads):
        dA, dB, dtensors, _, _ = _backward(ctx, grads)
        return (dA, dB, None, None, None, *dtensors)


def _setup(ctx, inputs, output):
    A, B, tensors, scalars, ints, plan = inputs
    keep_A, keep_B, used, n_user = entry(plan).saves
    ctx.plan, ctx.scalars, ctx.ints = plan, scalars, ints
    ctx.layout = (keep_A, keep_B, len(used), len(tensors))
    ctx.sizes = [A.shape[0] if A.dim() == 3 else 1, A.shape[-2], B.shape[-1], A.shape[-1]]
    ctx.save_for_backward(*([A] if keep_A else []), *([B] if keep_B else []), *[tensors[i] for i in used],
                          *output[n_user:])
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
    res = list((backward or gemm_backward_op)(A, B, used, saved, present, ctx.scalars, ctx.ints, ctx.sizes, key))
    dA = res.pop(0) if e.wrt_A and program.d_acc else None
    dB = res.pop(0) if e.wrt_B and program.d_acc else None
    by_param = dict(zip(program.grads, res))
    dtensors = [by_param[k.param].to(k.dtype) if k.param in by_param else None for k in p.keys]
    return dA, dB, dtensors, no_scalars, None


_lib.impl("gemm", _gemm_autograd, "Autograd")


class FusedGemm(torch.autograd.Function):
    """The same forward and backward as ``evtorch::gemm`` for eager mode, without the operator's dispatch (its
    autograd kernel, the fake-tensor and compile machinery; torch.compile uses the operator). ``call`` is the
    ``EagerCall`` of the call's signature: everything the forward and the backward do that the signature fixes
    is worked out there once.

    It takes the user's tensors (``evt.linear``: x and weight; the inputs as given) and makes the operands and
    canonical inputs inside (views, autocast casts), returning gradients in the user's shapes: one node in the
    autograd graph instead of one per view."""

    @staticmethod
    def forward(ctx, A, B, scalars, call, *tensors):
        given = (A, B, tensors)
        A, B, tensors = call.operands(A, B, tensors)
        out = call.forward(A, B, tensors, scalars)
        n_user = call.entry.saves[3]
        ctx.call, ctx.scalars = call, scalars
        # the last output, empty, is this node's anchor: saved, it comes back in the backward with
        # this node as its grad_fn, so gradients made with create_graph=True can lead back to A, B and the inputs
        anchor = A.new_empty(0)
        ctx.save_for_backward(*call.to_save(given, (A, B, tensors)), *out[n_user:], anchor)
        ctx.set_materialize_grads(False)
        quiet = [out[i] for i in call.entry.plan.independent] + list(out[n_user:])
        if quiet:
            ctx.mark_non_differentiable(*quiet)
        return (*out, anchor)

    @staticmethod
    def backward(ctx, *grads):
        grads = grads[:-1]  # the anchor's, never used
        if torch.is_grad_enabled():  # create_graph=True: the gradients must refuse to be differentiated
            with torch.no_grad():
                dA, dB, dtensors = ctx.call.backward(ctx, grads, hand_on=False)
            # tied to this node (the anchor), so a second derivative with respect to anything upstream (a
            # gradient penalty's torch.autograd.grad(loss, [x]), weights frozen or not) reaches the raising node
            dA, dB, *dtensors = _no_double_backward(dA, dB, *dtensors, anchors=ctx.saved_tensors[-1:])
        else:
            dA, dB, dtensors = ctx.call.backward(ctx, grads)
        return (dA, dB, None, None, *dtensors)


def _apply(t: Tensor, steps) -> Tensor:
    for method, arg in steps:
        t = apply_step(t, method, arg)
    return t


def _redo(steps) -> tuple | None:
    """The steps ``FusedGemm``'s backward applies to the saved caller's tensor to make an operand or input again
    (``EagerCall.to_save``): ``steps`` where they are views (reshape, permute: cheap), None where an autocast
    cast ends them (a new tensor, which the forward saves itself rather than cast again)."""
    return None if any(method == "to" for method, _ in steps) else steps


_TRANSPOSE = ("permute", (1, 0))


def _back(raw: Tensor, cast, steps, transposed: bool) -> tuple:
    """The steps from an operand's gradient (as the backward makes it: transposed for a column-major operand)
    to the user's tensor's: the autocast cast undone, the inverse views; a transpose and an inverse transpose
    (``weight.t()``'s) cancel."""
    from ..autodiff.canonical import inverse_steps
    views = ((_TRANSPOSE,) if transposed else ()) + inverse_steps(raw.shape, steps)
    if len(views) >= 2 and views[0] == _TRANSPOSE and views[1] == _TRANSPOSE:
        views = views[2:]
    return ((("to", raw.dtype),) if cast is not None else ()) + views


class EagerCall:
    """One signature of an eager ``fused_gemm`` / ``evt.linear`` call (keyed, in ``function``, on the epilogue,
    the options, grad mode, autocast, and every tensor's shape, strides, dtype, device and ``requires_grad``),
    prepared on its first call after all of ``prepare``'s checks: the plan, the view steps from the user's tensors
    to the operands and canonical inputs and back for their gradients (only steps that change something), the
    autocast casts, the scalars, what the forward saves, and per set of incoming gradients an ``EagerBackward``.
    A call then costs: the forward's launch (through ``_launch``) and the output views.

    ``A`` and ``B`` are the GEMM operands as ``prepare`` got them; ``raw`` the tensors the caller passes instead
    with the steps making A and B of them (``evt.linear``: x and weight, ``x.reshape(M, K)`` and ``weight.t()``)."""

    def __init__(self, key: str, A: Tensor, B: Tensor, inputs: dict, lead=None, raw=None):
        from ..autodiff.canonical import canonical_steps, inverse_steps, output_steps, space
        from .dispatch import autocast_dtype, autocast_target
        e = entry(key)
        p = e.plan
        self.key, self.entry, self.plan = key, e, p
        (raw_A, a_steps), (raw_B, b_steps) = raw if raw is not None else ((A, ()), (B, ()))
        low = autocast_dtype(A.device.type)  # as prepare casts A and B
        cast_A, cast_B = autocast_target(A.dtype, low), autocast_target(B.dtype, low)
        self.a_steps = a_steps + ((("to", cast_A),) if cast_A is not None else ())
        self.b_steps = b_steps + ((("to", cast_B),) if cast_B is not None else ())
        self.a_redo, self.b_redo = _redo(self.a_steps), _redo(self.b_steps)
        # gradients: back to the user's dtype (autocast), then through the inverse views; a column-major operand's
        # gradient comes from the backward as its transpose (see EagerBackward), a transpose more to undo
        self.a_back = _back(raw_A, cast_A, a_steps, False)
        self.b_back = _back(raw_B, cast_B, b_steps, False)
        self.a_back_col = _back(raw_A, cast_A, a_steps, True)
        self.b_back_col = _back(raw_B, cast_B, b_steps, True)
        batched = A.dim() == 3
        self.sizes = {"L": A.shape[0] if batched else 1, "M": A.shape[-2], "N": B.shape[-1]}
        order = space(batched)
        self.device = A.device
        self.names = e.names
        self.inputs = [canonical_steps(tuple(inputs[k.name].shape), k.binding, order, self.sizes) for k in p.keys]
        self.backs = [inverse_steps(tuple(inputs[k.name].shape), steps) for k, steps in zip(p.keys, self.inputs)]
        self.used_redo = [_redo(self.inputs[i]) for i in e.saves[2]]
        self.params = [k.param for k in p.keys]
        self.scalar_names = [s.name for _, s in p.scalars]
        self.scalars = _scalar_kinds(e)
        self.autograd = p.requires_grad
        self.outputs = [(o.position, output_steps(canonical_shape(o.walked, order, self.sizes), o.dims, order,
                                                  self.sizes, lead, o.layout)) for o in p.outputs]
        self.n_outputs, self.returns = len(p.ep.outputs), p.ep.returns
        self.differentiable = [(i, o.position) for i, o in enumerate(p.outputs) if o.differentiable]
        self.backwards: dict = {}
        self.site = _site(e)
        # cross-layer fusion (integration.deferred): A's gradient can be handed on unmultiplied when it is
        # d(acc) @ Bᵀ reshaped (no cast, no transpose on the way to the caller's tensor)
        self.can_defer_A = e.wrt_A and not e.a_col and all(m in ("reshape", "view") for m, _ in self.a_back)
        self.fusable_outputs = {o.position: i for i, o in enumerate(p.outputs)
                                if o.differentiable and o.walked == order}
        self._fusable: dict = {}

    def __call__(self, A: Tensor, B: Tensor, inputs: dict):
        """The call's results, in the epilogue's return convention (A, B: the caller's tensors, see ``raw``)."""
        tensors = [inputs[name] for name in self.names]
        # as given: ``forward`` / ``run`` convert each by its kind (an int stays exact beyond 2**53)
        scalars = [inputs[name] for name in self.scalar_names] if self.scalar_names else []
        if self.autograd:
            results = FusedGemm.apply(A, B, scalars, self, *tensors)[:-1]  # less the anchor (FusedGemm.forward)
        else:
            A, B, tensors = self.operands(A, B, tensors)
            results = self.forward(A, B, tensors, scalars)
        packed = [None] * self.n_outputs
        for (position, steps), value in zip(self.outputs, results):
            for method, arg in steps:
                value = apply_step(value, method, arg)
            packed[position] = value
        return pack_results(packed, self.returns)

    def can_fuse(self, position: int) -> bool:
        """Whether a gradient of output ``position`` alone, handed on unmultiplied, would be fused (the check
        ``EagerBackward.can_fuse`` makes for the gradients that actually arrive)."""
        ok = self._fusable.get(position)
        if ok is None:
            ok = self._fusable[position] = (position in self.fusable_outputs and
                                            EagerBackward(self, (position,)).can_fuse(position))
        return ok

    def operands(self, A: Tensor, B: Tensor, tensors) -> tuple:
        """The GEMM operands and the canonical inputs from the caller's tensors."""
        if self.a_steps:
            A = _apply(A, self.a_steps)
        if self.b_steps:
            B = _apply(B, self.b_steps)
        return A, B, [_apply(t, steps) if steps else t for t, steps in zip(tensors, self.inputs)]

    def to_save(self, given: tuple, operands: tuple) -> list:
        """What ``FusedGemm``'s forward saves of A, B and the inputs the backward reads (``entry.saves``), from the
        caller's tensors ``given`` and the ``operands`` made of them: the caller's tensor where views alone make
        the operand (``_redo``; the backward makes them again, ``saved_operands``), else the operand. A view made
        in the forward, under no_grad, and saved brought torch's "A view was created in no_grad mode ..." error
        in the backward where the caller had modified the tensor in place (a bias's ``add_``, found by a probe
        2026-11-29); the caller's tensor itself gets torch's usual "modified by an inplace operation" message,
        naming it as the caller knows it."""
        keep_A, keep_B, used, _ = self.entry.saves
        (gA, gB, gt), (A, B, tensors) = given, operands
        out = [gA if self.a_redo is not None else A] if keep_A else []
        if keep_B:
            out.append(gB if self.b_redo is not None else B)
        out += [gt[i] if redo is not None else tensors[i] for i, redo in zip(used, self.used_redo)]
        return out

    def saved_operands(self, saved) -> tuple:
        """(A, B, the inputs the backward reads) from what ``to_save`` saved (less the forward's saved values)."""
        keep_A, keep_B, _, _ = self.entry.saves
        i = 0
        A = B = None
        if keep_A:
            A, i = _apply(saved[0], self.a_redo or ()), 1
        if keep_B:
            B, i = _apply(saved[i], self.b_redo or ()), i + 1
        return A, B, [_apply(t, redo or ()) for t, redo in zip(saved[i:], self.used_redo)]

    def forward(self, A: Tensor, B: Tensor, tensors, scalars) -> tuple:
        """The forward-with-saves epilogue (``forward_impl``): the user's outputs, then the saved values."""
        e = self.entry
        kw = dict(zip(self.params, tensors))
        for (param, kind), value in zip(self.scalars, scalars):
            kw[param] = kind(value)
        return _launch(self.site, A, B, self.plan.forward_epilogue, e, e.out_dtype, kw, e.config)

    def backward(self, ctx, grads, hand_on: bool = True) -> tuple:
        """(dA, dB, input gradients) for the output gradients ``grads`` (``_backward``), in the caller's shapes.
        ``hand_on``: A's gradient may be handed to its producer unmultiplied (``integration.deferred``)."""
        keep_A, keep_B, used, _ = self.entry.saves
        n_operands = keep_A + keep_B + len(used)
        saved = ctx.saved_tensors[:-1]  # less FusedGemm's anchor
        A, B, inputs = self.saved_operands(saved[:n_operands])
        seeds, present = [], []
        deferred = False
        for index, position in self.differentiable:
            g = grads[index]
            if g is not None:
                seeds.append(position)
                present.append(g)
                deferred = deferred or type(g) is DeferredGrad
        if not seeds:
            return None, None, [None] * len(self.params)
        seeds = tuple(seeds)
        key = (seeds, *[g.stride() for g in present])  # their shapes, dtypes, devices: the outputs' (autograd)
        plan = self.backwards.get(key)
        if plan is None:
            if len(self.backwards) >= 64:
                self.backwards.clear()
            plan = self.backwards[key] = EagerBackward(self, seeds)
        candidate = None
        if deferred:  # a gradient handed on by the next evtorch layer: a candidate to fuse here, or computed
            for j, (position, g) in enumerate(zip(seeds, present)):
                if type(g) is not DeferredGrad:
                    continue
                if candidate is None and plan.can_fuse(position) and g.factors(self.plan.ep.acc_shape):
                    candidate = (f"g{position}", g)
                else:
                    present[j] = g.materialize()
        defer_A = hand_on and self.can_defer_A and _hand_on(ctx)
        dA, dB, dtensors = plan.run(A, B, inputs, saved[n_operands:], present, ctx.scalars, candidate, defer_A)
        e = self.entry
        if dA is not None:
            back = self.a_back_col if e.a_col else self.a_back
            if back:
                dA = _apply(dA, back)
        if dB is not None:
            back = self.b_back_col if e.b_col else self.b_back
            if back:
                dB = _apply(dB, back)
        return dA, dB, [_apply(g, back) if back and g is not None else g for g, back in zip(dtensors, self.backs)]


def _hand_on(ctx) -> bool:
    """Whether this node's A gradient goes to an evtorch producer that can fuse it (``integration.deferred``)."""
    if not deferred_enabled():
        return False
    found = producer(ctx)
    if found is None:
        return False
    node, index = found
    call = getattr(node, "call", None)
    position = None if call is None else next((pos for i, pos in call.differentiable if i == index), None)
    return position is not None and call.can_fuse(position)


_backward_gemm_get, (_BACKWARD_GEMM_KEY,) = knobs.raw_reader(knobs.BACKWARD_GEMM)
_HALF = (torch.float16, torch.bfloat16)


def _on_torch(X: Tensor, deterministic: bool) -> bool:
    """Whether a backward's plain GEMM (no epilogue: dA, dB) runs as ``torch.matmul`` (EVTORCH_BACKWARD_GEMM). By
    default for float16 / bfloat16 operands on a GPU: a plain GEMM is what cuBLAS is for, evtorch's kernel with
    the identity epilogue is no faster (H200, 8192 tokens x 4096 x 1024, tuned: the MLP block's three gradient
    GEMMs 262 us on cuBLAS against 285 on evtorch's kernels, bias + GELU's two 187 us on both), a call costs less
    host time and a training step's first call tunes two GEMM signatures fewer per layer (bias + GELU's forward +
    backward 42.8 -> 20.9 s, the MLP block's 63.4 -> 42.9 s; docs/autograd.md, "The backward's plain GEMMs on
    cuBLAS"). Not for float32 (torch.matmul follows torch's global TF32 flag, not evtorch's ``allow_tf32``) nor
    under ``deterministic=True`` (a promise evtorch's own kernels keep)."""
    if X.dtype not in _HALF:
        return False
    mode = "auto" if _backward_gemm_get(_BACKWARD_GEMM_KEY) is None else knobs.BACKWARD_GEMM.get()
    if mode == "auto":
        return X.is_cuda and not deterministic
    return mode == "torch"


class EagerBackward:
    """``backward_impl`` for one ``EagerCall`` and one set of seeded outputs, with what they fix worked out:
    the backward program, the keyword arguments of its passes, the epilogue-only operands and config, the
    identity epilogues of the dA / dB GEMMs, how results map to gradients."""

    def __init__(self, call: EagerCall, seeds: tuple):
        e, p = call.entry, call.plan
        self.entry = e
        self.program = program = p.backward(seeds)
        sizes = call.sizes
        self.keys = []  # per canonical input: (param, None if kept for the backward, else its NaN stand-in spec)
        for k in p.keys:
            stand_in = None
            if k.param not in p.used_params:
                stand_in = (float("nan") if k.dtype.is_floating_point else 0, k.dtype, [1] * len(p.key_shape(k, sizes)),
                            p.key_shape(k, sizes))
            self.keys.append((k.param, stand_in))
        self.scalars = call.scalars
        self.gnames = [f"g{pos}" for pos in seeds]
        self.n_vec = len(p.saved_vectors)
        self.saved_acc = p.mode == "saved"
        self.recompute = p.mode == "recompute"
        self.device = call.device
        self.sizes = sizes
        self.batched = p.ep.batched
        self.out_dtype = _backward_out_dtype(p, program)
        last = program.passes[-1] if program.passes else None
        self.stages = [(ep, stage.params, stage.outputs, stage is last)
                       for stage, ep in zip(program.passes, program.epilogues)]
        self.grads = []  # per canonical input: None, or (param, reshape to 0-d, dtype)
        for k in p.keys:
            self.grads.append((k.param, k.binding == (), k.dtype) if k.param in program.grads else None)
        self.n_inputs = len(p.keys)
        self.empty = None    # the epilogue-only operands, once made (not while a CUDA graph is captured)
        self.ep_dA = self.ep_dB = None
        # one LaunchSite per launch: EagerCall's key and the incoming gradients' strides fix their signatures
        self.sites = [_site(e) for _ in self.stages]
        self.site_dA, self.site_dB = _site(e), _site(e)
        self.call_fusable = call.fusable_outputs
        self.fused: dict = {}   # gradient name -> (fused epilogue, its params)
        self.site_fused = _site(e)
        self.choices: dict = {}  # (gradient name, operand signature) -> fuse? (``choose``)
        self.timings: dict = {}  # the same keys -> (fused ms, unfused ms) where they were timed
        self.acc_shape = p.ep.acc_shape

    def can_fuse(self, position: int) -> bool:
        """Whether the gradient of output ``position`` can arrive as the accumulator of a GEMM making it: the
        backward is one pass over the tile (no deferred reduction pass, no recomputed forward GEMM) reading
        that gradient, and the output is full-size."""
        program, gname = self.program, f"g{position}"
        return (position in self.call_fusable and not self.recompute and len(program.passes) == 1
                and gname in program.passes[0].params)

    def fused_epilogue(self, gname: str):
        """The backward pass with ``gname`` read from the accumulator: the epilogue of ``X @ Y`` where the
        product is that gradient (cached per gradient)."""
        ep = self.fused.get(gname)
        if ep is None:
            from ..autodiff.staging import signature_fn
            from ..epilogue import Epilogue
            stage, main = self.program.passes[0], self.program.epilogues[-1]
            params = [x for x in stage.params if x != gname]
            pass_fn = stage.fn

            def body(acc, kw):
                return pass_fn(acc, **kw, **{gname: acc})
            fn = signature_fn(f"{main.name}_from_{gname}", params, body)
            specs = [s for s in main.input_specs if s.name != gname]
            ep = self.fused[gname] = (Epilogue(fn, main.acc_shape, main.acc_dtype, specs, intermediates="eager"),
                                      params)
        return ep

    def choose(self, gname: str, g: DeferredGrad, X: Tensor, Y: Tensor, kw: dict, opA, opB) -> bool:
        """Whether to run the backward pass as the epilogue of ``X @ Y`` (the gradient ``gname``) rather than
        computing the product and running the epilogue-only pass: decided once per operand signature.

        The fused kernel saves the product's write and read, but its epilogue runs after the GEMM's main loop,
        not overlapped with it; on an H200 that cost more than the separate memory-bound pass for both GELU and
        ReLU MLP blocks (docs/autograd.md). So on a GPU the two are timed when autotuning is on, and without
        timing (autotuning off, CUDA graph capture) the product is computed. On the CPU it is fused."""
        if deferred_mode() == "always":
            return True
        key = (gname, X.shape, Y.shape, X.dtype, X.stride(), Y.stride())
        choice = self.choices.get(key)
        if choice is not None:
            return choice
        if self.device.type != "cuda":
            choice = True
        elif torch.cuda.is_current_stream_capturing():  # nothing can be timed now; remember nothing
            return False
        elif knobs.autotune_enabled():
            from ..runtime.autotune import time_ms
            ep, params = self.fused_epilogue(gname)
            fkw = {x: kw[x] for x in params}
            e, run = self.entry, g._product.run

            def fused():
                _launch(self.site_fused, X, Y, ep, e, self.out_dtype, fkw)

            def unfused():
                self._passes(dict(kw, **{gname: run(X, Y)}), opA, opB)
            times = (time_ms(fused, 5, 25), time_ms(unfused, 5, 25))
            self.timings[key] = times
            choice = times[0] < times[1]
        else:
            choice = False
        self.choices[key] = choice
        return choice

    def _passes(self, kw: dict, opA, opB) -> dict:
        """The backward passes as epilogue-only kernels (or over the recomputed ``A @ B``): the main pass'
        results (earlier passes' results go into ``kw``)."""
        e, results = self.entry, {}
        for site, (ep, params, outputs, last) in zip(self.sites, self.stages):
            outs = _launch(site, opA, opB, ep, e, self.out_dtype, {x: kw[x] for x in params})
            (results if last else kw).update(zip(outputs, outs))
        return results

    def run(self, A, B, used, saved, grads, scalars, candidate=None, defer_A=False, cast=True) -> tuple:
        """(dA, dB, input gradients). ``candidate``: (name of a gradient, the ``DeferredGrad`` it is) when that
        gradient is an uncomputed ``X @ Y``: the backward pass runs as that GEMM's epilogue if ``choose`` says
        so. ``defer_A``: return dA as a ``DeferredGrad`` for the producer of A to fuse. ``cast``: input gradients
        in their inputs' dtypes (else as the backward epilogue makes them, ``grad_dtypes``: the operator's)."""
        e, program = self.entry, self.program
        kw: dict = {}
        used = iter(used)
        device = self.device
        for param, stand_in in self.keys:
            if stand_in is None:
                kw[param] = next(used)
            else:  # inputs the backward does not read were not kept; a NaN stand-in shows any mistake loudly
                value, dtype, ones, shape = stand_in
                kw[param] = _constant(value, dtype, device).view(ones).expand(shape)
        for (param, kind), value in zip(self.scalars, scalars):
            kw[param] = kind(value)
        for name, g in zip(self.gnames, grads):
            kw[name] = g
        n_vec = self.n_vec
        for i in range(n_vec):
            kw[f"v{i}"] = saved[i]
        if self.saved_acc:
            kw["acc_s"] = saved[n_vec]
        if self.recompute:
            opA, opB = A, B
        else:
            opA, opB = self._empty_operands(grads[0] if grads else saved[0], e.ab_dtype)
        fused = False
        if candidate is not None:
            gname, g = candidate
            X, Y = g.factors(self.acc_shape)
            fused = self.choose(gname, g, X, Y, kw, opA, opB)
            if fused:
                g.take(self.acc_shape)
                ep, params = self.fused_epilogue(gname)
                outs = _launch(self.site_fused, X, Y, ep, e, self.out_dtype, {x: kw[x] for x in params})
                results = dict(zip(program.passes[0].outputs, outs))
            else:
                kw[gname] = g.materialize()
        if not fused:
            results = self._passes(kw, opA, opB)
        d_acc_from = None if fused else program.d_acc_from
        dA = dB = None
        if program.d_acc:
            d_acc = kw[d_acc_from] if d_acc_from is not None else results["d_acc"]
            if d_acc.dtype != e.ab_dtype:
                d_acc = d_acc.to(e.ab_dtype)
            # dA = d(acc) @ Bᵀ, dB = Aᵀ @ d(acc); for a column-major operand its transpose, row-major (the
            # caller transposes it back: EagerCall.a_back_col)
            if e.wrt_A and defer_A:
                dA = DeferredGrad.of_product(d_acc, B.mT, self._dA)
            elif e.wrt_A:
                dA = self._matmul(B, d_acc.mT, "ep_dA", self.site_dA) if e.a_col else \
                    self._matmul(d_acc, B.mT, "ep_dA", self.site_dA)
            if e.wrt_B:
                if self.batched and not e.b_batched:  # B broadcast over the batch: its gradient sums over L
                    L, M, K = A.shape
                    X, Y = A.reshape(L * M, K), d_acc.reshape(L * M, -1)
                else:
                    X, Y = A, d_acc
                dB = self._matmul(Y.mT, X, "ep_dB", self.site_dB) if e.b_col else \
                    self._matmul(X.mT, Y, "ep_dB", self.site_dB)
        dtensors = []
        for slot in self.grads:
            if slot is None:
                dtensors.append(None)
                continue
            param, zero_d, dtype = slot
            g = results[param]
            if zero_d and len(g.shape):
                g = g.reshape(())
            dtensors.append(g if not cast or g.dtype == dtype else g.to(dtype))
        return dA, dB, dtensors

    def _dA(self, X: Tensor, Y: Tensor) -> Tensor:
        return self._matmul(X, Y, "ep_dA", self.site_dA)

    def _matmul(self, X: Tensor, Y: Tensor, which: str, site) -> Tensor:
        """``X @ Y``, a plain GEMM of the backward (dA or dB): through ``torch.matmul`` where ``_on_torch`` says so,
        else evtorch's kernel with the identity epilogue of its (fixed) shapes remembered."""
        if _on_torch(X, self.entry.deterministic):
            if torch.is_autocast_enabled(X.device.type):  # a backward run inside the caller's autocast region
                with _no_autocast(X.device.type):
                    return torch.matmul(X, Y)
            return torch.matmul(X, Y)
        ep = getattr(self, which)
        if ep is None:
            ep = _identity_epilogue(X, Y)
            setattr(self, which, ep)
        return _launch(site, X, Y, ep, self.entry, X.dtype, {})[0]

    def _empty_operands(self, ref: Tensor, dtype) -> tuple[Tensor, Tensor]:
        if self.empty is not None:
            return self.empty
        ops = _empty_operands(ref, self.sizes, self.batched, dtype)
        if _is_constant(ops[0]):  # views of a kept constant are kept with it (``_constant`` decided, once)
            self.empty = ops
        return ops


# ---------------------------------------------------------------------------------------------------- backward
def col_major(t: Tensor) -> bool:
    """Whether a 2-D operand is column-major (``weight.t()``): its gradient is then produced column-major."""
    if t.dim() != 2:
        return False
    s0, s1 = operator.index(t.stride(0)), operator.index(t.stride(1))  # static under torch.compile
    return s0 == 1 and s1 != 1


_constants: dict = {}


def _constant(value, dtype, device) -> Tensor:
    """A cached one-element tensor (no fill kernel per call); not cached where it cannot be kept (a CUDA graph's
    capture or its warm-up under torch.compile's CUDA-graph trees: ``runtime.pools.keepable``)."""
    key = (value if value == value else "nan", dtype, str(device))
    t = _constants.get(key)
    if t is None:
        t = torch.full((1,), value, dtype=dtype, device=device)
        if keepable(t):
            _constants[key] = t
    return t


def _is_constant(t: Tensor) -> bool:
    """Whether ``t`` views one of the kept constants of ``_constant``."""
    ptr = t.untyped_storage().data_ptr()
    return any(c.untyped_storage().data_ptr() == ptr for c in _constants.values())


def _empty_operands(A: Tensor, sizes: dict, batched: bool, dtype) -> tuple[Tensor, Tensor]:
    """Operands of an epilogue-only GEMM (K = 0): the template runs no K step and hands a zero accumulator
    to the epilogue. Backed by one element so no launcher ever sees a null pointer."""
    one = _constant(0, dtype, A.device)
    lead = (sizes["L"],) if batched else ()
    za = one.as_strided(lead + (sizes["M"], 0), (0,) * (len(lead) + 2))
    zb = one.as_strided(lead + (0, sizes["N"]), (0,) * (len(lead) + 2))
    return za, zb


class _OperatorCall:
    """What ``EagerBackward`` reads of an ``EagerCall``, for the backward operator, which has none: the plan, the
    sizes and the device (no cross-layer fusion: nothing hands it a gradient unmultiplied)."""

    def __init__(self, e: Entry, sizes: dict, device: torch.device):
        self.entry, self.plan, self.sizes, self.device = e, e.plan, sizes, device
        self.scalars = _scalar_kinds(e)
        self.fusable_outputs: dict = {}


_op_backwards: dict = {}


def backward_impl(A: Tensor | None, B: Tensor | None, tensors: list[Tensor], saved: list[Tensor],
                  grads: list[Tensor], scalars: list[float], ints: list[int], sizes: list[int],
                  plan: str) -> list[Tensor]:
    """``evtorch::gemm_backward`` (what torch.compile's backward graph calls): the eager path's ``EagerBackward``,
    one per plan and signature of the arguments (their launch sites assume what the signature fixes), so that a
    repeated call costs the eager backward's host time, not its checks and its preparation again."""
    args = [t for t in (A, B, *tensors, *saved, *grads) if t is not None]
    memo = (plan, tuple(sizes), *[(t.shape, t.stride(), t.dtype, t.device) for t in args])
    bw = _op_backwards.get(memo)
    if bw is None:
        key, seeds = plan.split("|")
        call = _OperatorCall(entry(key), dict(zip("LMN", sizes)), args[0].device)
        bw = EagerBackward(call, tuple(int(s) for s in seeds.split(",")))
        if len(_op_backwards) >= 256:
            _op_backwards.clear()
        _op_backwards[memo] = bw
    dA, dB, dtensors = bw.run(A, B, tensors, saved, grads, merge_scalars(bw.entry, scalars, ints), cast=False)
    e = bw.entry
    out = []
    # a column-major operand's gradient comes back as its row-major transpose (EagerBackward.run)
    if dA is not None:
        out.append(dA.mT if e.a_col else dA)
    if dB is not None:
        out.append(dB.mT if e.b_col else dB)
    by_param = {k.param: g for k, g in zip(e.plan.keys, dtensors) if g is not None}
    return out + [by_param[param] for param in bw.program.grads]


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


_lib.impl("gemm_backward", lambda *args: backward_impl(*args), "CompositeExplicitAutograd")


def _gemm_backward_fake(A, B, tensors, saved, grads, scalars, ints, sizes, plan):
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


torch.library.register_fake("evtorch::gemm_backward", _gemm_backward_fake, lib=_lib)


_DOUBLE_BACKWARD = ("double backward through evt.gemm is not supported: the backward of a fused GEMM is itself "
                    "fused and has no derivative. Compute higher-order gradients with the eager epilogue "
                    "(fn(A @ B, **inputs)) instead")


def _no_double_backward(*grads, anchors=()):
    """``grads`` refusing a second differentiation (``nodouble``), tied to ``anchors``."""
    return refuse_double_backward(grads, anchors, _DOUBLE_BACKWARD)


def _gemm_backward_autograd(A, B, tensors, saved, grads, scalars, ints, sizes, plan):
    """``evtorch::gemm_backward``'s autograd kernel: its results refuse to be differentiated (``_NoDoubleBackward``)
    where an input requires grad (a backward taken with create_graph=True)."""
    with torch._C._AutoDispatchBelowAutograd():
        out = gemm_backward_op(A, B, tensors, saved, grads, scalars, ints, sizes, plan)
    if _requires_grad(A, B, *tensors, *saved, *grads):
        return _no_double_backward(*out, anchors=(A, B, *tensors, *saved, *grads))
    return out


_lib.impl("gemm_backward", _gemm_backward_autograd, "Autograd")

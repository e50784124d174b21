"""``fused_gemm``: evt.gemm as the differentiable ``torch.ops.evtorch.gemm``.

Written so that torch.compile traces it without a graph break: the plan lookup (tracing the epilogue,
building forward and backward epilogues) happens in ``_plan``, which Dynamo runs once at trace time and treats as
a constant (``torch.compiler.assume_constant_result``: its arguments are the epilogue function, shapes, dtypes
and flags, all constants of the traced frame). What remains are views (``to_canonical``/``from_canonical``),
casts and the operator call, which Dynamo and AOTAutograd handle natively.
"""
from __future__ import annotations

import operator

import torch

from ..autodiff.canonical import from_canonical, space, to_canonical
from ..autodiff.plan import check_policy
from ..epilogue import normalize_keep, pack_results
from ..errors import EpilogueError
from ..frontend.signature import check_hashable
from ..runtime import knobs
from .dispatch import autocast_dtype, autocast_target, resolve_deterministic
from .ops import Entry, col_major, gemm_op, register


def _static(shape) -> tuple:
    """Sizes as Python ints. Under torch.compile with dynamic shapes, ``operator.index`` makes Dynamo specialize
    each size (a guard per size; ``int()`` would keep it symbolic): a plan is built per shape."""
    return tuple([operator.index(s) for s in shape])


def _number_type(name, v):
    """The Python type of keyword input ``v``, a number (a tensor is handled by the caller). Anything else is
    refused with evt.gemm's own message (``input_spec``): a list, a string, None or a NumPy array reached
    ``float()`` in ``_as_float`` as a raw TypeError / ValueError, and a NumPy float32 was taken where evt.gemm
    without gradients refuses it (found by a probe 2026-11-29)."""
    if isinstance(v, bool):
        return bool
    if isinstance(v, (int, torch.SymInt)):
        return int
    if not isinstance(v, (float, torch.SymFloat)):
        from ..frontend.signature import input_spec
        input_spec(name, v)  # raises: not a number
    return float


@torch.compiler.assume_constant_result
def _plan(fn, a_shape, a_dtype, b_shape, specs, wrt, out_dtype, backend, deterministic, allow_tf32, keep, config,
          policy, layout):
    """(key, static info) of the plan for these arguments; built and registered on first use.

    ``fn`` is the epilogue, or ("linear", fn, has_bias) for ``evt.linear``'s composed epilogue (built here, out
    of Dynamo's sight: a function created in a traced frame is not a constant), whose keyword inputs are checked
    here in the user's epilogue's names (``linear._check_inputs``)."""
    if isinstance(fn, tuple) and fn[0] == "linear":
        from .linear import _check_inputs
        _check_inputs(fn[1], [spec[0] for spec in specs])
    key = plan_key(fn, a_shape, a_dtype, b_shape, specs, wrt, out_dtype, backend, deterministic, allow_tf32, keep,
                   config, policy, layout)
    from .ops import entry
    return (key,) + entry(key).static


def plan_key(fn, a_shape, a_dtype, b_shape, specs, wrt, out_dtype, backend, deterministic, allow_tf32, keep,
             config, policy, layout) -> str:
    """The key of the plan for these arguments (``_plan``'s), built and registered on first use. Its ``Entry``
    can make the key of the same call differentiating more leaves (``Entry.widen``): a traced or exported
    program names the plan of its trace, whose leaves needing gradients were those of the example inputs."""
    def build():
        from ..api import check_operands, get_epilogue
        from .linear import linear_epilogue
        epilogue = linear_epilogue(*fn[1:]) if isinstance(fn, tuple) else fn
        from ..autodiff import GradPlan
        from ..frontend.signature import spec as make_spec
        A = torch.empty(a_shape, dtype=a_dtype, device="meta")
        B = torch.empty(b_shape, dtype=a_dtype, device="meta")
        L, M, N, K, batched = check_operands(A, B)
        acc_dtype = torch.float64 if a_dtype == torch.float64 else torch.float32
        examples = {name: (make_spec(shape, dtype) if kind == "tensor" else kind(1))
                    for name, kind, shape, dtype in specs}
        ep = get_epilogue(epilogue, (L, M, N) if batched else (M, N), acc_dtype, examples, keep=keep)
        wrt_A, wrt_B, wrt_inputs = wrt
        plan = GradPlan(ep, wrt_acc=wrt_A or wrt_B, wrt_inputs=wrt_inputs, out_dtype=out_dtype or a_dtype,
                        policy=policy)
        kinds = {name: kind for name, kind, _, _ in specs}
        scalar_types = tuple(kinds[s.name] for _, s in plan.scalars)
        def widen(wider):
            return plan_key(fn, a_shape, a_dtype, b_shape, specs, wider, out_dtype, backend, deterministic,
                            allow_tf32, keep, config, policy, layout)
        return Entry(plan, wrt_A, wrt_B, out_dtype or a_dtype, backend, deterministic, allow_tf32, config,
                     scalar_types, a_dtype, layout[0], layout[1], len(b_shape) == 3, widen)
    signature = (fn, a_shape, a_dtype, b_shape, specs, wrt, out_dtype, backend, deterministic, allow_tf32, keep,
                 config, policy, layout, knobs.trace_knobs_text())  # the traced epilogue depends on them
    return register(signature, build)


def prepare(A, B, epilogue=None, /, *, as_op=False, out_dtype=None, backend=None, deterministic=False,
            allow_tf32=False, outputs=None, config=None, policy="save", **inputs):
    """The arguments of ``torch.ops.evtorch.gemm`` for this call and how to unpack its results:
    ((A, B, tensors, scalars, ints, key), (outputs' (position, dims, layout), number of outputs, return convention,
    sizes)).
    ``scalars`` and ``ints`` only ``as_op`` (the operator's number lists, ``ops`` module docstring); the eager path
    passes the numbers as given."""
    from ..api import _identity, check_backend, check_options
    from ..epilogue import Epilogue
    if not isinstance(A, torch.Tensor) or not isinstance(B, torch.Tensor):
        raise EpilogueError(f"A and B must be tensors, got {type(A).__name__} and {type(B).__name__}")
    for name, v in inputs.items():
        if isinstance(v, torch.Tensor) and v.device != A.device:
            raise EpilogueError(f"input {name!r} is on {v.device} but A and B are on {A.device}; move it to {A.device}")
    low = autocast_dtype(A.device.type)
    if low is not None:  # like F.linear under autocast (dispatch.autocast_target)
        cast_A, cast_B = autocast_target(A.dtype, low), autocast_target(B.dtype, low)
        A = A.to(cast_A) if cast_A is not None else A
        B = B.to(cast_B) if cast_B is not None else B
    check_options(epilogue, allow_tf32, inputs, config)
    check_policy(policy)  # before _plan, whose cache key a list policy failed as unhashable
    check_hashable(epilogue, "the epilogue")
    backend = check_backend(A, backend)
    fn = epilogue.fn if isinstance(epilogue, Epilogue) else (epilogue if epilogue is not None else _identity)
    specs = tuple((name, "tensor", _static(v.shape), v.dtype) if isinstance(v, torch.Tensor) else
                  (name, _number_type(name, v), (), None) for name, v in inputs.items())
    grad = torch.is_grad_enabled()
    wrt = (grad and A.requires_grad, grad and B.requires_grad,
           frozenset(n for n, v in inputs.items() if isinstance(v, torch.Tensor) and grad and v.requires_grad))
    keep = normalize_keep(outputs)  # as evt.gemm takes it: an int is one position (it raised a raw TypeError)
    key, keys, scalar_names, outs, n_outputs, returns, _ = _plan(
        fn, _static(A.shape), A.dtype, _static(B.shape), specs, wrt, out_dtype, backend, deterministic, allow_tf32,
        keep, config, policy, (col_major(A), col_major(B)))
    batched = A.dim() == 3
    a_shape, b_shape = _static(A.shape), _static(B.shape)
    sizes = {"L": a_shape[0] if batched else 1, "M": a_shape[-2], "N": b_shape[-1]}
    order = space(batched)
    tensors = [to_canonical(inputs[name], binding, order, sizes) for name, binding in keys]
    if not as_op:
        return (A, B, tensors, None, None, key), (outs, n_outputs, returns, sizes, order)
    kinds = {spec[0]: spec[1] for spec in specs}
    scalars = [_as_float(name, inputs[name]) for name in scalar_names if kinds[name] is not int]
    ints = [_as_int(name, inputs[name]) for name in scalar_names if kinds[name] is int]
    return (A, B, tensors, scalars, ints, key), (outs, n_outputs, returns, sizes, order)


def _as_float(name: str, value) -> float:
    """A runtime number the operator's ``float[] scalars`` carries (a float or a bool)."""
    return float(value)


def _as_int(name: str, value):
    """A runtime int as the operator's ``SymInt[] ints`` carries it: an int64, exact, and symbolic where Dynamo made
    it so. (Until 2026-11-29 ints went into the ``float[]`` too: ``float(k)`` guarded on each value
    (``sym_float(k) == 3.0``), so every new int recompiled and the ninth failed a ``fullgraph=True`` compile at the
    recompile limit, found by a probe where the docs said ints stay symbolic; and ints beyond 2**53, which a float64
    does not hold, had to be refused.) An int outside int64 is refused: ``torch._check`` raises for a known value
    and guards a symbolic one, where an exception raised in traced code, or a helper that needs a constant, broke
    the compile."""
    message = (f"evt.gemm: input {name!r} is an integer outside int64, which torch.ops.evtorch.gemm passes as an "
               "int64 scalar; pass a float or a value in [-2**63, 2**63)")  # no value in it: formatting a symbolic
    torch._check(-2 ** 63 <= value, lambda: message)  # int would specialize it
    torch._check(value < 2 ** 63, lambda: message)
    return value


def fused_gemm(A, B, epilogue=None, /, *, out_dtype=None, backend=None, deterministic=None, allow_tf32=False,
               outputs=None, config=None, policy="save", _lead_dims=None, **inputs):
    """``evt.gemm`` through ``torch.ops.evtorch.gemm`` (same arguments and results; see ``evtorch.api.gemm``).

    ``policy`` (extra option): "save" keeps the accumulator for the backward when it needs it; "recompute"
    recomputes ``A @ B`` in the backward instead (less memory, one more GEMM). ``_lead_dims`` (for
    ``evt.linear``): outputs whose first dim walks the rows get these leading dims instead of M."""
    deterministic = resolve_deterministic(deterministic)
    if not torch.compiler.is_compiling():
        # eager: the same operator as an autograd.Function (ops.FusedGemm), without torch.library's call
        # overhead, prepared once per call signature (see _eager)
        try:
            key = (epilogue, _lead_dims, torch.is_grad_enabled(), autocast_dtype(A.device.type),
                   A.shape, A.stride(), A.dtype, A.device, A.requires_grad,
                   B.shape, B.stride(), B.dtype, B.device, B.requires_grad,
                   out_dtype, backend, deterministic, allow_tf32,
                   tuple(outputs) if isinstance(outputs, list) else outputs, config, policy, knobs.trace_knobs_text(),
                   *[(name, v.shape, v.stride(), v.dtype, v.device, v.requires_grad) if isinstance(v, torch.Tensor)
                     else (name, type(v)) for name, v in inputs.items()])
            call = _calls.get(key)
        except (AttributeError, TypeError):  # not tensors, unhashable options: prepare says what is wrong
            key = call = None
        if call is None:
            call = _eager_call(key, A, B, epilogue, _lead_dims, inputs, out_dtype=out_dtype, backend=backend,
                               deterministic=deterministic, allow_tf32=allow_tf32, outputs=outputs, config=config,
                               policy=policy)
        return call(A, B, inputs)
    args, (outs, n_outputs, returns, sizes, order) = prepare(
        A, B, epilogue, as_op=True, out_dtype=out_dtype, backend=backend, deterministic=deterministic,
        allow_tf32=allow_tf32, outputs=outputs, config=config, policy=policy, **inputs)
    results = gemm_op(*args)
    packed = [None] * n_outputs
    for (position, dims, layout), value in zip(outs, results):
        value = from_canonical(value, dims, order, sizes, layout)
        if _lead_dims is not None and dims and dims[0][0] == ("M",):
            value = value.reshape(tuple(_lead_dims) + tuple(value.shape[1:]))
        packed[position] = value
    return pack_results(packed, returns)


# Eager calls: each call signature gets an ``ops.EagerCall`` on its first call, made after all of ``prepare``'s
# checks; later calls of the signature build the key above, look it up, and run. The key holds everything
# ``prepare`` reads: the epilogue object, grad mode, autocast, each tensor's shape, strides, dtype, device and
# requires_grad (strides: operand layouts, and whether canonical views are views), the options' values, and the
# numbers' types (their values are runtime scalars).
_calls: dict = {}
_CALLS_LIMIT = 1024


def _eager_call(key, A, B, epilogue, lead, inputs, raw=None, **options):
    """The ``EagerCall`` of a new signature (``raw``: see ``EagerCall``), remembered under ``key``."""
    from .ops import EagerCall
    plan_key = prepare(A, B, epilogue, **options, **inputs)[0][-1]  # every check; builds the plan
    call = EagerCall(plan_key, A, B, inputs, lead, raw)
    if key is not None:
        if len(_calls) >= _CALLS_LIMIT:
            _calls.clear()
        _calls[key] = call
    return call


def op_arguments(A, B, epilogue=None, /, **options):
    """The arguments ``torch.ops.evtorch.gemm`` is called with for ``evt.gemm(A, B, epilogue, **options)`` (for
    ``torch.library.opcheck`` and inspection)."""
    return prepare(A, B, epilogue, as_op=True, **options)[0]


def grad_plan(A, B, epilogue=None, /, **options):
    """The ``autodiff.GradPlan`` evt.gemm uses for this call: ``.summary()``, ``.saved_for_backward``,
    ``.backward(seeds).show()``. Which leaves are differentiated follows ``requires_grad`` as in the call."""
    from .ops import entry
    return entry(op_arguments(A, B, epilogue, **options)[-1]).plan

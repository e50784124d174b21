"""The public entry points: ``gemm``, ``row_index``, ``col_index``, ``register_op``.

``evt.gemm(A, B, fn, **inputs)`` equals ``fn(A.float() @ B.float(), **inputs)`` with full-size outputs in
``A.dtype`` (or ``out_dtype``) and reduction outputs in float32 (float64 for float64 A and B). On CUDA tensors
it runs one generated Triton kernel (plus, when needed, a small vector-stage kernel); on CPU the reference
executor, or the generated kernels through the Triton interpreter with ``backend="triton"``.
"""
from __future__ import annotations

import functools
from typing import Callable

import torch

from .epilogue import Epilogue, normalize_keep
from .errors import EpilogueError, EpilogueTypeError, ShapeError
from .frontend.proxy import TracedTensor
from .frontend.signature import check_dense, check_keywords, input_spec
from .integration import dispatch as _integration
from .ir.types import FLOAT_DTYPES as GEMM_DTYPES  # the operands' and full-size outputs' dtypes
from .ops.registry import FLOAT_ONLY, REGISTRY, define
from .runtime import knobs

BACKENDS = ("reference", "triton")


def _identity(acc):
    return acc


@functools.lru_cache(maxsize=512)
def _cached_epilogue(fn, acc_shape, acc_dtype, specs, keep, trace_knobs, intermediates):
    # trace_knobs (knobs.trace_knobs_text(): EVTORCH_DISABLE_PASSES, EVTORCH_INTERMEDIATES) is part of the key
    # only: the Epilogue reads the knobs itself, but for ``intermediates`` when an Epilogue object fixed it
    return Epilogue(fn, acc_shape, acc_dtype, list(specs), keep=keep, intermediates=intermediates)


def get_epilogue(fn_or_ep, acc_shape, acc_dtype, inputs: dict, keep=None) -> Epilogue:
    """The traced, optimized epilogue for this signature (cached; tracing never depends on values). An
    ``Epilogue`` traced for another signature is traced again with its own ``intermediates`` setting and, unless
    ``keep`` (``outputs=``) says otherwise, its own pruned outputs."""
    fn = fn_or_ep.fn if isinstance(fn_or_ep, Epilogue) else fn_or_ep
    if not callable(fn):
        raise EpilogueTypeError(f"epilogue must be a function or an evt.Epilogue, got {type(fn).__name__}")
    names = check_keywords(fn, inputs)
    specs = tuple(input_spec(n, inputs[n]) for n in names if n in inputs)
    keep = normalize_keep(keep)
    if keep is None and isinstance(fn_or_ep, Epilogue):
        keep = fn_or_ep.keep  # an Epilogue traced with keep= keeps its pruning (outputs= overrides it)
    intermediates = None
    if isinstance(fn_or_ep, Epilogue):
        if fn_or_ep.signature == (tuple(acc_shape), acc_dtype, tuple(s.signature for s in specs), keep):
            return fn_or_ep
        intermediates = fn_or_ep.intermediates
    try:
        return _cached_epilogue(fn, tuple(acc_shape), acc_dtype, specs, keep, knobs.trace_knobs_text(), intermediates)
    except TypeError as e:
        if "unhashable" in str(e):
            return Epilogue(fn, tuple(acc_shape), acc_dtype, list(specs), keep=keep, intermediates=intermediates)
        raise


def check_operands(A, B) -> tuple[int, int, int, int, bool]:
    """Validate A and B; returns (L, M, N, K, batched)."""
    for name, t in (("A", A), ("B", B)):
        if not isinstance(t, torch.Tensor):
            raise EpilogueTypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        check_dense(t, name, name)
        if t.dim() not in (2, 3):
            raise ShapeError(f"{name} must have 2 or 3 dims ((M, K) / (L, M, K) for A, (K, N) / (L, K, N) for B), "
                             f"got shape {tuple(t.shape)}")
        if t.dtype not in GEMM_DTYPES:
            raise EpilogueTypeError(f"{name} has dtype {t.dtype}; expected one of float16, bfloat16, float32, float64")
    if A.dtype != B.dtype:
        raise EpilogueTypeError(f"A and B must have the same dtype, got A {A.dtype} and B {B.dtype}")
    if A.device != B.device:
        raise EpilogueError(f"A and B must be on the same device, got A on {A.device} and B on {B.device}")
    if A.shape[-1] != B.shape[-2]:
        raise ShapeError(f"inner dimensions of A {tuple(A.shape)} and B {tuple(B.shape)} do not match: "
                         f"A.shape[-1] = {A.shape[-1]} but B.shape[-2] = {B.shape[-2]}")
    if B.dim() == 3 and A.dim() == 2:
        raise ShapeError(f"batched B {tuple(B.shape)} needs batched A (L, M, K), got A {tuple(A.shape)}")
    batched = A.dim() == 3
    if batched and B.dim() == 3 and A.shape[0] != B.shape[0]:
        raise ShapeError(f"batch sizes of A {tuple(A.shape)} and B {tuple(B.shape)} differ")
    L = A.shape[0] if batched else 1
    return L, A.shape[-2], B.shape[-1], A.shape[-1], batched


def gemm(A: torch.Tensor, B: torch.Tensor, epilogue: Callable | Epilogue | None = None, /, *extra,
         out_dtype: torch.dtype | None = None, backend: str | None = None, deterministic: bool | None = None,
         allow_tf32: bool = False, outputs=None, config=None, **inputs):
    """``epilogue(A @ B, **inputs)`` as one fused kernel.

    Args:
        A: (M, K) or (L, M, K); B: (K, N) or (L, K, N); float16, bfloat16, float32 or float64.
        epilogue: a plain PyTorch function whose first parameter is the fp32 accumulator (or an ``Epilogue``).
        out_dtype: dtype of full-size outputs (default ``A.dtype``).
        backend: "triton" (default on CUDA) or "reference" (default on CPU).
        deterministic: combine cross-tile reductions in a fixed order (bit-identical across runs); None (the
            default) follows ``torch.use_deterministic_algorithms``.
        allow_tf32: let float32 GEMMs use TF32 tensor cores.
        outputs: positions of the outputs wanted (others are pruned and returned as None).
        config: a ``GemmConfig`` to use instead of autotuning.
        **inputs: the epilogue's keyword inputs: tensors (roles follow broadcasting against acc) or numbers.

    Differentiable with respect to A, B and every tensor input, compilable with torch.compile and autocast-aware:
    in those cases the call goes through ``torch.ops.evtorch.gemm`` (``evtorch.integration``).
    """
    deterministic = _integration.resolve_deterministic(deterministic)
    if extra:
        raise EpilogueTypeError(f"evt.gemm takes the epilogue's inputs as keywords: evt.gemm(A, B, fn, C=C, ...); got "
                                f"{len(extra)} more positional argument(s) after the epilogue")
    if _integration.transforms_active() and not torch.compiler.is_compiling():
        _integration.check_transforms("evt.gemm", (A, B, *inputs.values()), backend)
    if _integration.wanted(A, B, inputs):
        return _integration.gemm(A, B, epilogue, out_dtype=out_dtype, backend=backend, deterministic=deterministic,
                                 allow_tf32=allow_tf32, outputs=outputs, config=config, **inputs)
    try:
        key = _call_key(A, B, epilogue, out_dtype, backend, deterministic, allow_tf32, outputs, config, inputs)
        hit = _calls.get(key)
    except (AttributeError, TypeError):  # not tensors, unhashable arguments: the checks below say what is wrong
        key = hit = None
    fresh = hit is None
    if fresh:
        hit = _prepare(A, B, epilogue, out_dtype, backend, outputs, inputs, allow_tf32, config)
        if key is not None:
            if len(_calls) >= _CALLS_LIMIT:
                _calls.clear()
            _calls[key] = hit
    ep, out_dtype, backend, site = hit
    if ep.merging_loads:  # an input's dims merged by a reshape, read as one flat dim: a copy where they do not merge
        inputs = ep.viewable_inputs(inputs)
    # a signature seen before: its prepared launch, without ``launch_key`` (a fresh one has no launch to find yet)
    if site is not None and not fresh:
        res = site.run(ep, A, B, inputs, out_dtype, deterministic, allow_tf32, config)
        if res is not None:
            return res
    if backend == "reference":  # (config, which no kernel reads here, was checked by _prepare)
        acc = torch.matmul(A.to(ep.acc_dtype), B.to(ep.acc_dtype))
        return ep.reference(acc, out_dtype=out_dtype, **inputs)
    return _run_gemm(ep, A, B, inputs, out_dtype=out_dtype, deterministic=deterministic, allow_tf32=allow_tf32,
                     config=config)


# Each call signature is checked and its epilogue looked up (signature inspection, tracing on first use) once: a
# later call with the same epilogue object, options, operand and input shapes / strides / dtypes / devices and
# input kinds skips both, and on the Triton backend goes to its launch through a ``LaunchSite``, which the key
# fixes everything for but the operands' alignment and the knobs: a key of this size instead of the runtime's
# ``launch_key`` as well. With launches stubbed (``python -m benchmarks.host_overhead``, 2-core CPU machine,
# 2026-11-28) evt.gemm with mixed_dag's epilogue went from 28.3-28.7 to 24.3-25.2 us a call, the identity from
# 9.0-9.7 to 8.0-8.2.
_calls: dict = {}
_CALLS_LIMIT = 1024


def _call_key(A, B, epilogue, out_dtype, backend, deterministic, allow_tf32, outputs, config, inputs) -> tuple:
    key = [epilogue, out_dtype, backend, deterministic, allow_tf32, tuple(outputs) if isinstance(outputs, list)
           else outputs, config, A.shape, A.stride(), A.dtype, A.device, B.shape, B.stride(), B.dtype, B.device,
           knobs.trace_knobs_text()]
    for name, v in inputs.items():
        key.append((name, v.shape, v.stride(), v.dtype, v.device) if isinstance(v, torch.Tensor)
                   else (name, type(v)))
    return tuple(key)


def check_options(epilogue, allow_tf32, inputs: dict, config=None) -> None:
    """The call's options, before the epilogue is traced (by evt.gemm and ``integration.function.prepare``): the
    epilogue given as ``epilogue=`` reached the tracer as an input of the identity epilogue, and a string for a
    flag was taken as true. ``config`` is checked here for every backend and path: on the triton backend a dict
    failed as "unhashable type: 'dict'" (a cache key) and a string as the launcher's bare TypeError (found by a
    probe 2026-11-29)."""
    check_config(config)
    if epilogue is None and "epilogue" in inputs:
        raise EpilogueTypeError("evt.gemm takes the epilogue positionally, after A and B: evt.gemm(A, B, fn, "
                                "**inputs); got it as the keyword epilogue=")
    if not isinstance(allow_tf32, bool):  # (deterministic is checked by dispatch.resolve_deterministic)
        raise EpilogueTypeError(f"allow_tf32 must be True or False, got {allow_tf32!r}")


def check_config(config) -> None:
    """``config=``: None (autotune / heuristic) or an evtorch ``GemmConfig``; on the reference backend, which has
    no kernel to configure, a config of the wrong kind is still a mistake."""
    if config is None:
        return
    from .codegen.configs import GemmConfig
    if not isinstance(config, GemmConfig):
        raise EpilogueTypeError(f"config must be an evtorch GemmConfig or None, got {type(config).__name__} "
                                f"{config!r:.100} (make one with evtorch.codegen.configs.GemmConfig(...))")


def check_backend(A, backend) -> str:
    """The backend a call on ``A``'s device runs: ``backend``, or the device's default, checked before anything
    runs (by evt.gemm and by the differentiable path, ``integration.function.prepare``). The triton backend runs
    on CUDA tensors, and on CPU tensors through Triton's interpreter only: without it, or on another device
    (meta), the launch failed inside Triton or torch ("0 active drivers", "Cannot copy out of meta tensor")."""
    if backend is None:
        backend = "triton" if A.is_cuda else "reference"
    if backend not in BACKENDS:
        raise EpilogueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "triton" and not A.is_cuda:
        from .runtime import knobs
        if A.device.type != "cpu":
            raise EpilogueError(f"backend='triton' runs on CUDA tensors (or CPU tensors through Triton's "
                                f"interpreter), got A and B on {A.device}; use backend='reference' there")
        if not knobs.interpreter_active():
            raise EpilogueError(f"backend='triton' on {A.device} tensors needs Triton's CPU interpreter: set "
                                "TRITON_INTERPRET=1 in the environment before triton is imported, or use "
                                "backend='reference' (the CPU default)")
    return backend


def _prepare(A, B, epilogue, out_dtype, backend, outputs, inputs, allow_tf32=False, config=None) -> tuple:
    """Every check of a call and its traced epilogue: (epilogue, out_dtype, backend, its ``LaunchSite`` on the
    Triton backend, else None)."""
    check_options(epilogue, allow_tf32, inputs, config)
    epilogue = _identity if epilogue is None else epilogue
    L, M, N, K, batched = check_operands(A, B)
    if out_dtype is not None and out_dtype not in GEMM_DTYPES:
        raise EpilogueTypeError(f"out_dtype must be one of float16, bfloat16, float32, float64, got {out_dtype}")
    for name, v in inputs.items():
        if isinstance(v, torch.Tensor) and v.device != A.device:
            raise EpilogueError(f"input {name!r} is on {v.device} but A and B are on {A.device}; move it to {A.device}")
    backend = check_backend(A, backend)
    acc_dtype = torch.float64 if A.dtype == torch.float64 else torch.float32
    acc_shape = (L, M, N) if batched else (M, N)
    ep = get_epilogue(epilogue, acc_shape, acc_dtype, inputs, keep=outputs)
    site = None
    if backend == "triton":
        from .runtime.gemm import LaunchSite
        site = LaunchSite()
    return ep, out_dtype or A.dtype, backend, site


def _run_gemm(*args, **kwargs):
    global _run_gemm
    from .runtime.gemm import run_gemm
    _run_gemm = run_gemm
    return run_gemm(*args, **kwargs)


def row_index(x) -> TracedTensor:
    """The global row coordinate m of every element of ``x`` (a traced value shaped like acc), as int64.

    On a real tensor (the epilogue called eagerly, as its own reference) it is the same coordinate grid."""
    return _coordinate(x, -2, "evt.row_index")


def col_index(x) -> TracedTensor:
    """The global column coordinate n of every element of ``x`` (a traced value shaped like acc), as int64.

    On a real tensor (the epilogue called eagerly, as its own reference) it is the same coordinate grid."""
    return _coordinate(x, -1, "evt.col_index")


def _coordinate(x, dim: int, name: str):
    """``name``'s coordinate along ``dim`` (-2 rows, -1 columns): traced inside an epilogue, a grid on a tensor."""
    if isinstance(x, torch.Tensor) and not isinstance(x, TracedTensor):
        return _eager_index(x, dim, name)
    if not isinstance(x, TracedTensor):
        raise EpilogueTypeError(f"{name} takes the traced acc (inside an epilogue), got {type(x).__name__}")
    return x.tracer.index(x, dim, name)


def _eager_index(x: torch.Tensor, dim: int, what: str) -> torch.Tensor:
    """``arange`` along ``dim`` of a real tensor, broadcast to its shape (what the traced index node means)."""
    if x.dim() < -dim:
        raise ShapeError(f"{what}: dim {dim} is out of range for a value of shape {tuple(x.shape)}; pass acc "
                         "(or a value shaped like it)")
    shape = [1] * x.dim()
    shape[dim] = x.shape[dim]
    return torch.arange(x.shape[dim], device=x.device).view(shape).expand(x.shape)


def register_op(name: str, torch_fn: Callable, triton_fn, *, derivative: Callable | None = None,
                float_only: bool = True) -> Callable:
    """Add a user-defined elementwise op (the EVT seed's "add a new unary operation").

    ``torch_fn`` is its eager meaning (and reference), a Python function whose parameters are the op's operands;
    ``triton_fn`` a ``@triton.jit`` function taking and returning Triton tensors in the compute dtype (fp32);
    ``derivative(grad, *operands, out)`` optionally its backward: the gradient of each operand (a tuple, or one
    tensor for a unary op), written with the ops an epilogue may use (it is traced like one: ``torch.cos`` of a
    registered op's derivative is refused as in an epilogue). Returns a callable to use inside epilogues (on real
    tensors it calls ``torch_fn``).
    """
    if not name.isidentifier():
        raise EpilogueError(f"register_op: name must be a Python identifier, got {name!r}")
    if name in REGISTRY:
        raise EpilogueError(f"register_op: an op named {name!r} already exists")
    if not hasattr(triton_fn, "fn") and not callable(triton_fn):
        raise EpilogueTypeError("register_op: triton_fn must be a @triton.jit function")
    import inspect as _inspect
    try:
        arity = len(_inspect.signature(torch_fn).parameters)
    except (TypeError, ValueError):
        raise EpilogueTypeError(f"register_op: torch_fn {torch_fn!r} has no signature to read the op's operands "
                                "from (a builtin such as torch.cos); pass a Python function, e.g. "
                                "lambda x: torch.cos(x)") from None
    if derivative is not None:
        rule = derivative

        def derivative(*args, **kw):  # one gradient per operand; a unary op's rule may return it bare
            grads = rule(*args, **kw)
            return grads if isinstance(grads, (tuple, list)) else (grads,)
    params = [f"x{i}" for i in range(arity)]
    namespace: dict = {}
    exec(f"def _sig({', '.join(params)}): ...", namespace)  # a signature with the op's arity
    op = define(name, namespace["_sig"], operands=tuple(params), torch_ref=torch_fn,
                triton=f"{name}({', '.join('{%d}' % i for i in range(arity))})", derivative=derivative,
                traits=frozenset({FLOAT_ONLY}) if float_only else frozenset(), user_defined=triton_fn)

    def call(*args):
        if any(isinstance(a, TracedTensor) for a in args):
            tracer = next(a for a in args if isinstance(a, TracedTensor)).tracer
            return tracer.call_op(op, args, {}, spelled=name)
        return torch_fn(*args)

    call.__name__ = name
    call.op = op
    return call

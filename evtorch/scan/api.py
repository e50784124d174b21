"""``evt.scan``: TVM-style recurrences written as plain PyTorch, compiled to Triton.

    Y = evt.scan(lambda prev, x: prev + x, X)                          # cumulative sum over dim 0
    H = evt.scan(lambda h, a, x: a * h + x, A, X, init=X[:1])           # first-order linear recurrence
    S1, S2 = evt.scan(lambda s1, s2, x: (s1 + x, s2 + s1[..., :1]),     # two coupled states
                      X, init=(X[:1], torch.zeros(1, l)))

The body receives the previous step's state rows, then the current step's input rows, and returns the new
state rows. ``init`` gives the first k >= 1 steps of every state; the result is each state's full history
(T rows along ``dim``), as in TVM. ``h.at(-2)`` reads a state two steps back (needs k >= 2); ``x.at(-1)``
reads an input one step back. ``post(*states, *inputs)`` maps each step's new states (and that step's input
rows) to the outputs returned instead of the states, fused into the same kernel (e.g. ``y_t = c_t * h_t``).
"""
from __future__ import annotations

import operator
from typing import Callable

import torch

from ..epilogue import pack_results, returns_of
from ..errors import EpilogueError, EpilogueTypeError
from ..frontend.signature import check_dense
from ..integration.dispatch import check_transforms, func_grad_active, resolve_deterministic, transforms_active
from ..ir.types import HALF_DTYPES
from .autograd import differentiable
from .body import RowSpec, ScanBody
from .errors import ScanError, ScanShapeError
from .launch import ScanConfig, check_deterministic_strategy, run_forward

BACKENDS = ("reference", "triton")
_CACHE: dict = {}
_CACHE_LIMIT = 256


def _fn_key(fn):
    """What identifies a body for caching: its code plus every value it can see that tracing would bake in
    (closure cells, defaults, the module globals it names), so a lambda written inline (a new function
    object per call) is traced once, and a changed constant (``alpha = 0.7``) is traced again."""
    if fn is None:
        return None
    code = getattr(fn, "__code__", None)
    if code is None:
        return fn
    glob = getattr(fn, "__globals__", {})
    seen = tuple((name, glob[name]) for name in code.co_names if name in glob)
    cells = tuple(c.cell_contents for c in (fn.__closure__ or ()))
    kw = tuple(sorted(fn.__kwdefaults__.items())) if fn.__kwdefaults__ else None
    # a bound method (``cell.step``) shares its __code__ with every instance's: its ``self`` is part of the key
    key = (code, getattr(fn, "__self__", None), cells, fn.__defaults__, kw, seen)
    try:
        hash(key)
    except TypeError:  # an unhashable captured value: no caching for this body
        return None
    return key


def get_body(fn, post, states: list[RowSpec], inputs: list[RowSpec], k: int) -> ScanBody:
    """The traced body for this signature (cached: tracing depends on row shapes and dtypes, never on T)."""
    fkey, pkey = _fn_key(fn), _fn_key(post)
    if fkey is None or (post is not None and pkey is None):
        return ScanBody(fn, states, inputs, k, post=post)
    key = (fkey, pkey, tuple((s.shape, s.dtype) for s in states), tuple((s.shape, s.dtype) for s in inputs), k)
    hit = _CACHE.get(key)
    if hit is None:
        if len(_CACHE) >= _CACHE_LIMIT:
            _CACHE.pop(next(iter(_CACHE)))
        hit = _CACHE[key] = ScanBody(fn, states, inputs, k, post=post)
    return hit


class _Runner:
    """What the autograd function calls to run a forward (and its backward's reverse scan) again."""

    def __init__(self, backend: str, config, deterministic: bool = False):
        self.backend, self.config, self.deterministic = backend, config, deterministic

    def __call__(self, body, inits, inputs, T):
        return run_forward(body, inits, inputs, T, self.backend, self.config, self.deterministic)


def _describe(init) -> str:
    """What a refused ``init`` is, down to the element that is not a tensor (``(X[:1], None)`` read only as
    'got tuple' before, which did not say what was wrong with it)."""
    if isinstance(init, (tuple, list)):
        if not init:
            return f"an empty {type(init).__name__}"
        bad = next(j for j, t in enumerate(init) if not isinstance(t, torch.Tensor))
        return f"a {type(init).__name__} whose element {bad} is a {type(init[bad]).__name__}"
    return type(init).__name__


def _check_dim(dim) -> int:
    """``dim`` as an int (numpy's and 0-d integer tensors too, through ``operator.index``). A float or a string
    failed inside torch (``movedim() received an invalid combination of arguments``) or Python (``'<=' not
    supported between instances of 'int' and 'str'``), naming neither the parameter nor what it takes (found by
    a probe, 2026-11-29); a bool would silently scan dim 1 for True."""
    try:
        if isinstance(dim, bool):
            raise TypeError
        return operator.index(dim)
    except TypeError:
        raise EpilogueTypeError(f"evt.scan: dim must be an int (the dim to scan over, e.g. 0 or -1), got "
                                f"{type(dim).__name__} {dim!r}") from None


def _time_major(x: torch.Tensor, dim: int, what: str) -> tuple[torch.Tensor, int]:
    if x.dim() == 0:
        raise ScanShapeError(f"{what} is a 0-d tensor; it needs a dim to scan over (dim={dim})")
    if not -x.dim() <= dim < x.dim():
        raise ScanShapeError(f"dim={dim} is out of range for {what} of shape {tuple(x.shape)}")
    d = dim % x.dim()
    return x.movedim(d, 0), d


# Dynamo must not trace into evt.scan: it would trace the body's tracing (proxies, registry lookups) and fail inside
# its own machinery (InternalTorchDynamoError even without fullgraph). Compiled code calls it eagerly (a graph break)
@torch.compiler.disable(reason="evt.scan traces its body and launches its kernels outside torch.compile")
def scan(body: Callable, *inputs: torch.Tensor, init=None, dim: int = 0, post: Callable | None = None,
         backend: str | None = None, config: ScanConfig | None = None, length: int | None = None,
         deterministic: bool | None = None):
    """Run the recurrence ``state[t] = body(state[t-1], ..., inputs[t]...)`` over ``dim``.

    Args:
        body: ``body(*states, *inputs) -> new state rows`` (a tensor, or a tuple with one per state).
        *inputs: tensors with the same length T along ``dim``; the body sees one row (step) of each.
        init: the first k steps of the state(s): a tensor (one state) or a tuple or list of tensors (one per
            state), each with leading extent k >= 1 along ``dim``. Default: ``inputs[0]``'s first step (one state).
        dim: the scan dim, for inputs, init and results alike.
        post: optional ``post(*states, *inputs) -> outputs``: returned instead of the states, per step. Their
            scan dim is the inputs' (``dim`` counted on the inputs' rank), or their last dim where they have
            fewer.
        backend: "triton" (generated kernels; default on CUDA, on CPU through TRITON_INTERPRET=1) or
            "reference" (a loop over time with torch ops; default on CPU).
        config: a ``ScanConfig`` overriding the launch heuristics.
        length: T when there are no inputs.
        deterministic: bit-identical results (and gradients) from run to run. The parallel kernels of an
            associative recurrence (``a * h + b``, sums, max, logaddexp) fold earlier chunks' totals in whatever
            order the decoupled look-back finds them published, which changes float roundings between runs;
            deterministic scans take the three-pass strategy (a fixed order; 1.1-1.8x the look-back's time on an
            H200, docs/scan.md "Determinism"), and a ``config.strategy`` that looks back is refused. None (the default)
            follows ``torch.use_deterministic_algorithms``. Step-by-step scans (``lanes``, coupled states, the
            reference backend) are deterministic either way.

    Returns:
        The full history of each state (T steps along ``dim``; the first k are init): a tensor (init a tensor or
        None), a tuple (init a tuple) or a list (init a list), as the eager loop would hold them; with ``post``,
        its outputs (a tensor or tuple, like ``post`` returns).
    """
    if not callable(body):
        raise EpilogueTypeError(f"evt.scan: body must be a function, got {type(body).__name__}")
    if post is not None and not callable(post):
        raise EpilogueTypeError(f"evt.scan: post must be a function, got {type(post).__name__}")
    for i, x in enumerate(inputs):
        if not isinstance(x, torch.Tensor):
            raise EpilogueTypeError(f"evt.scan: input {i} is a {type(x).__name__}; inputs are tensors with a scan "
                                    "dim (use Python numbers directly inside the body)")
    for what, t in [(f"input {i}", x) for i, x in enumerate(inputs)] + \
            ([("init", init)] if isinstance(init, torch.Tensor) else
             [(f"init {j}", t) for j, t in enumerate(init)] if isinstance(init, (tuple, list)) else []):
        # sparse / mkldnn rows have no strides to scan: torch failed inside the row views ('aten::as_strided ...
        # SparseCPU backend')
        check_dense(t, f"evt.scan: {what}", "it")
    if init is None:
        if not inputs:
            raise ScanError("evt.scan: without inputs, init is required (the first k steps of each state)")
        init_list = []
    elif isinstance(init, torch.Tensor):
        init_list = [init]
    elif isinstance(init, (tuple, list)) and init and all(isinstance(t, torch.Tensor) for t in init):
        init_list = list(init)
    else:
        raise EpilogueTypeError("evt.scan: init must be a tensor or a non-empty tuple or list of tensors (one per "
                                f"state), got {_describe(init)}")

    # the histories come back in init's container, as the eager loop holds them (a list init came back a tuple,
    # found by a probe 2026-11-29); a tuple subclass (a namedtuple) as a plain tuple, as ``returns_of`` reads it
    returns = returns_of(init)
    dim = _check_dim(dim)
    if length is not None:  # an integer (numpy's and 0-d integer tensors too, operator.index), not 3.7 floored
        try:
            steps = None if isinstance(length, bool) else operator.index(length)
        except TypeError:
            steps = None
        if steps is None or steps < 0:
            raise ScanError(f"evt.scan: length must be a non-negative int (the number of steps T), got {length!r}")
        length = steps
    xs, ts = [], set()
    for i, x in enumerate(inputs):
        xt, _ = _time_major(x, dim, f"input {i}")
        xs.append(xt)
        ts.add(xt.shape[0])
    if len(ts) > 1:
        sizes = ", ".join(f"input {i}: {x.shape[0]}" for i, x in enumerate(xs))
        raise ScanShapeError(f"evt.scan: inputs have different lengths along dim {dim} ({sizes}); every input "
                             "gives one row per step")
    if xs:
        T = xs[0].shape[0]
        if length is not None and length != T:
            raise ScanShapeError(f"evt.scan: length={length} but the inputs have {T} steps along dim {dim}")
    elif length is None:
        raise ScanError("evt.scan: with no inputs, pass length=T")
    else:
        T = int(length)

    inits, out_dims, ks = [], [], set()
    if init is None:  # the default: one state starting at input 0's first step
        if T == 0:
            raise ScanShapeError(f"evt.scan: the inputs have no steps along dim {dim} (T = 0) and no init was given: "
                                 "the first state is input 0's first step; pass init= or at least one step")
        inits.append(xs[0][:1])
        out_dims.append(dim % inputs[0].dim())
        ks.add(1)
    for j, t in enumerate(init_list):
        it, d = _time_major(t, dim, f"init {j}" if returns != "tensor" else "init")
        inits.append(it)
        out_dims.append(d)
        ks.add(it.shape[0])
    if len(ks) > 1:
        raise ScanShapeError(f"evt.scan: init tensors give different numbers of steps along dim {dim} "
                             f"({', '.join(str(t.shape[0]) for t in inits)}); every state needs the same k")
    k = inits[0].shape[0]
    if k < 1:
        raise ScanShapeError(f"evt.scan: init has no steps along dim {dim}; give at least the first step")
    if k > T:
        raise ScanShapeError(f"evt.scan: init gives {k} steps but the scan has only T = {T}")
    devices = {t.device for t in inits + xs}
    if len(devices) > 1:
        raise EpilogueError(f"evt.scan: inputs and init are on different devices ({', '.join(map(str, devices))})")
    device = inits[0].device
    if backend is None:
        backend = "triton" if device.type == "cuda" else "reference"
    if backend not in BACKENDS:
        raise EpilogueError(f"evt.scan: backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "triton" and device.type not in ("cuda", "cpu"):  # meta: the interpreter failed copying it out
        raise EpilogueError(f"evt.scan: backend='triton' runs on CUDA tensors (or CPU tensors through Triton's "
                            f"interpreter), got tensors on {device}; use backend='reference' there")
    if config is not None and not isinstance(config, ScanConfig):
        raise EpilogueTypeError(f"evt.scan: config must be an evtorch.scan.ScanConfig or None, got "
                                f"{type(config).__name__}")

    if transforms_active() and not torch.compiler.is_compiling():
        check_transforms("evt.scan", inits + xs, backend, vmap_on_reference=True, grad=False)
    states = [RowSpec(f"s{j}", tuple(t.shape[1:]), t.dtype) for j, t in enumerate(inits)]
    specs = [RowSpec(f"x{i}", tuple(x.shape[1:]), x.dtype) for i, x in enumerate(xs)]
    traced = get_body(body, post, states, specs, k)
    deterministic = resolve_deterministic(deterministic, "evt.scan: deterministic")
    check_deterministic_strategy(config, deterministic)
    runner = _Runner(backend, config, deterministic)
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in inits + xs)
    if needs_grad:
        if post is None:
            plain = traced
        else:
            # post reads the states as the kernels hold them, in the compute dtype: a 16-bit state's history is
            # kept at that precision for it (post on the rounded history made the result depend on requires_grad,
            # found 2026-11-29)
            held = [RowSpec(s.name, s.shape, traced.compute_dtype) if s.dtype in HALF_DTYPES else s for s in states]
            inits = [t.to(h.dtype) for t, h in zip(inits, held)]
            plain = get_body(body, None, held, specs, k)
        results = differentiable(traced, plain, inits, xs, T, runner, step_by_step=func_grad_active())
    else:
        results = runner(traced, inits, xs, T)

    if post is not None:
        # the time dim at the inputs' position of it (counted on their rank: dim=-2 and dim=1 of a 3-d input
        # place it alike, which counting on a post output's own rank did not, found 2026-11-29), or last where a
        # post output has fewer dims
        d = dim % (inputs[0] if inputs else init_list[0]).dim()
        outs = [r.movedim(0, min(d, r.dim() - 1)) if r.dim() > 0 else r for r in results]
        return pack_results(outs, traced.post_returns)
    outs = [r.movedim(0, d) for r, d in zip(results, out_dims)]
    return pack_results(outs, returns)

"""Tracing a scan body (and its optional ``post``) into per-step IR graphs.

The body runs once on ``ScanValue`` proxies: one per state (its row at step t-1) and one per input (its row
at step t). Every op goes through the shared op registry and the epilogue tracer's dispatch (operators,
Tensor methods, ``torch.*``/``F.*`` calls, decompositions, dtype checks, the user's line in errors); this
tracer only changes what values *are*: a row with a shape, whose leaves carry lane maps (``lanes.py``), so
slices such as ``s1[..., :1]`` and any broadcast work. A traced update, printed::

    %h : f32[-] = input s0 lag=1, map=((0,0,1)), shape=(4)       # h = state 0 at step t-1
    %a : f32[-] = input x0 lag=0, map=((0,0,1)), shape=(4)
    %t0 : f32[-] = compute mul(%a, %h)
    %x : f32[-] = input x1 lag=0, map=((0,0,1)), shape=(4)
    %t1 : f32[-] = compute add(%t0, %x)
    %out0 : f32[-] = output[0](%t1)                             # the new row of state 0

Leaves are ``input`` nodes named ``s<j>`` (states) and ``x<i>`` (inputs) with ``lag`` (steps back from the
step computed: states 1..k in the update, 0 in ``post``; inputs 0 unless ``x.at(-j)``), ``map`` and
``shape``. Graphs are optimized with the shared passes (prune, CSE, simplify).
"""
from __future__ import annotations

import inspect
import math

import torch

from ..errors import EpilogueError, TraceControlFlowError, UnsupportedOpError
from ..frontend import dims as D
from ..frontend.proxy import TracedTensor
from ..frontend.tracer import Tracer
from ..ir.graph import Graph
from ..ir.node import Node
from ..ir.types import SUPPORTED_DTYPES, Stage
from ..ops import REGISTRY
from ..ops.registry import OpDef
from ..passes.cse import CSE
from ..passes.pipeline import run_pipeline
from ..passes.prune import Prune
from ..passes.simplify import Simplify
from . import lanes as LN
from . import ops as _scan_ops  # noqa: F401  (declares logaddexp if the registry lacks it)
from .errors import (ScanControlFlowError, ScanError, ScanShapeError, ScanStepError, ScanTraceError,
                     ScanUnsupportedOpError)


class ScanValue(TracedTensor):
    """A row of a scan body. Body parameters also know their source, so ``h.at(-2)`` reads step t-2."""

    __slots__ = ("source",)

    def __init__(self, tracer, node, dims, dtype, label=None, source=None):
        super().__init__(tracer, node, None, dims, dtype, label=label)
        self.source = source  # (kind, index, default lag) for body parameters, else None

    def at(self, offset: int) -> "ScanValue":
        """This parameter's row at step ``t + offset`` (t = the step being computed); ``h`` is ``h.at(-1)``,
        ``x`` is ``x.at(0)``."""
        return self.tracer.read_at(self, offset)

    def narrow(self, dim, start, length):
        return self.tracer.view(self, "narrow", (dim, start, length), {})

    def select(self, dim, index):
        return self.tracer.view(self, "select", (dim, index), {})


class ScanTracer(Tracer):
    """The epilogue tracer's dispatch with row semantics: no accumulator, no pending inputs, slices allowed."""

    def __init__(self, k: int, states, inputs, *, post: bool = False):
        # deliberately not calling Tracer.__init__: there is no accumulator and no iteration space
        self.registry = REGISTRY
        self.graph = Graph()
        self.device = torch.device("cpu")
        self.acc_dtype = torch.float32
        self._consts = {}
        self._tile_dependent = set()
        self._memo = {}
        self.k = k
        self.post = post
        self.states = [self._param("s", j, spec) for j, spec in enumerate(states)]
        self.inputs = [self._param("x", i, spec) for i, spec in enumerate(inputs)]

    # ------------------------------------------------------------------ leaves
    def _param(self, kind, index, spec):
        name, shape, dtype = spec
        lag = 0 if kind == "x" or self.post else 1
        v = self.leaf(kind, index, lag, LN.identity(len(shape)), tuple(shape), dtype, label=name)
        v.source = (kind, index, name, tuple(shape))
        return v

    def leaf(self, kind, index, lag, lane_map, shape, dtype, label=None) -> ScanValue:
        attrs = {"lag": lag, "map": LN.normalize(lane_map, shape), "shape": tuple(shape)}
        key = (kind, index, lag, attrs["map"], attrs["shape"])
        node = self._memo.get(key)
        if node is None:
            node = self.graph.add("input", f"{kind}{index}", (), attrs, (), dtype, Stage.TILE, name=label,
                                  meta={"where": self.user_frame(), "shape": tuple(shape)})
            self._memo[key] = node
        return ScanValue(self, node, [D.Dim(s) for s in shape], dtype, label=label)

    def read_at(self, v: ScanValue, offset) -> ScanValue:
        if v.source is None:
            raise ScanTraceError(".at(offset) reads another step of a body parameter (a state or an input); "
                                 f"{v.label or 'this value'} is computed inside the body", where=self.user_frame())
        kind, index, name, shape = v.source
        if isinstance(offset, TracedTensor) or not isinstance(offset, int) or isinstance(offset, bool):
            raise ScanTraceError(f"{name}.at(offset): offset must be a Python int, got {type(offset).__name__}",
                                 where=self.user_frame())
        what = "state" if kind == "s" else "input"
        if self.post:
            raise ScanStepError(f"post reads {what} {name!r} at step t{offset:+d}; post maps one step's states and "
                                "inputs to outputs and reads step t only", where=self.user_frame())
        if kind == "s" and offset >= 0:
            step = "the step being computed" if offset == 0 else "a later step"
            raise ScanStepError(f"the update reads state {name!r} at step t{offset:+d}, {step}; an update may only "
                                f"read earlier steps of a state ({name}.at(-1), which is {name} itself, down to "
                                f"{name}.at(-{self.k}) with {self.k} init step(s))", where=self.user_frame())
        if kind == "x" and offset > 0:
            raise ScanStepError(f"the update reads input {name!r} at step t{offset:+d}, a later step; inputs may be "
                                f"read at step t ({name}) or earlier ({name}.at(-1) ...)", where=self.user_frame())
        if -offset > self.k:
            raise ScanStepError(f"the update reads {what} {name!r} at step t{offset:+d}, but init gives only "
                                f"{self.k} step(s), so the first computed step (t = {self.k}) would read step "
                                f"{self.k + offset}; pass init with at least {-offset} rows", where=self.user_frame())
        return self.leaf(kind, index, -offset, LN.identity(len(shape)), shape, v.dtype, label=f"{name}_{-offset}")

    # ------------------------------------------------------------------ dispatch overrides
    def _refuse_captured(self, name, args, kwargs):
        for a in list(args) + list(kwargs.values()):
            if isinstance(a, torch.Tensor):
                # the tensor may also have been made in the body (torch.ones(5)): that was reported as captured
                # from outside, which misled (found by a probe, 2026-11-29)
                raise ScanTraceError(f"{name}() got a real tensor of shape {tuple(a.shape)}, captured from outside "
                                     "the scan body or made inside it; pass it to evt.scan as an input (after the "
                                     "states' parameters) so that its rows are read step by step, or write a "
                                     "constant as a number", where=self.user_frame())

    def call_torch(self, func, args, kwargs):
        if func is torch.narrow:
            return self.view(args[0], "narrow", args[1:], kwargs)
        if func is torch.select:
            return self.view(args[0], "select", args[1:], kwargs)
        return super().call_torch(func, args, kwargs)

    def reduce(self, op: OpDef, x, dim=None, keepdim=False, dtype=None):
        raise ScanTraceError(f"{op.name}() reduces over lanes; a scan body computes each lane of the new rows "
                             "from lanes of earlier rows, so reductions are not supported inside it (slice the "
                             "lanes you need, e.g. s[..., :1])", where=self.user_frame())

    def index(self, v, dim, what):
        raise ScanTraceError(f"{what} is for GEMM epilogues; it is not available in a scan body",
                             where=self.user_frame())

    def full_like(self, func, args, kwargs):
        x = args[0]
        node, dtype = self.fill_constant(func, args, kwargs, error=ScanTraceError)
        if node.dtype != dtype:
            node = self._compute("cast", [node], {"dtype": dtype}, dtype, ())
        return ScanValue(self, node, x.dims, dtype)

    # ------------------------------------------------------------------ elementwise
    def apply(self, op: OpDef, operands: list, attrs: dict, spelled: str) -> ScanValue:
        proxies = [v for v in operands if isinstance(v, TracedTensor)]
        if not proxies:
            raise ScanTraceError(f"{spelled} got no traced tensor", where=self.user_frame())
        self._check_dtypes(op, operands, spelled)
        meta = self._meta_eval(op, operands, attrs, spelled)
        out_dtype = meta.dtype if isinstance(meta, torch.Tensor) else proxies[0].dtype
        out_shape = tuple(meta.shape) if isinstance(meta, torch.Tensor) else tuple(proxies[0].shape)
        nodes = []
        for i, v in enumerate(operands):
            if isinstance(v, TracedTensor):
                nodes.append(self.broadcast(v, out_shape, spelled).node)
            elif v is None and op.name == "clamp":  # an open bound
                nodes.append(self.const(-math.inf if i == 1 else math.inf))
            else:
                nodes.append(self.const(v))
        node = self._compute(op.name, nodes, attrs, out_dtype, out_shape)
        return ScanValue(self, node, [D.Dim(s) for s in out_shape], out_dtype)

    def _compute(self, target, nodes, attrs, dtype, shape) -> Node:
        return self.graph.add("compute", target, nodes, attrs, (), dtype, Stage.TILE,
                              meta={"where": self.user_frame(), "shape": tuple(shape)})

    def broadcast(self, v: TracedTensor, shape, what) -> TracedTensor:
        if tuple(v.shape) == tuple(shape):
            return v
        view, new_shape = LN.expand(tuple(v.shape), shape, what)
        return self._viewed(v, view, new_shape)

    # ------------------------------------------------------------------ views
    def _viewed(self, v: TracedTensor, view, new_shape) -> ScanValue:
        node = self.rematerialize(v.node, tuple(view), tuple(new_shape))
        return ScanValue(self, node, [D.Dim(s) for s in new_shape], v.dtype, label=v.label)

    def rematerialize(self, node: Node, view, shape) -> Node:
        """``node`` seen through ``view``: leaves get composed maps, computations are re-derived."""
        if node.op == "const":
            return node
        key = (id(node), view, shape)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        if node.op == "input":
            kind, index = node.target[0], int(node.target[1:])
            lane_map = LN.compose(node.attrs["map"], view, shape)
            out = self.leaf(kind, index, node.attrs["lag"], lane_map, shape, node.dtype, label=node.name).node
        else:
            args = [self.rematerialize(a, view, shape) for a in node.args]
            out = self._compute(node.target, args, node.attrs, node.dtype, shape)
        self._memo[key] = out
        return out

    def view(self, v: TracedTensor, method: str, args=(), kwargs=None) -> TracedTensor:
        kwargs = kwargs or {}
        what = f".{method}()"
        shape, rank = tuple(v.shape), v.ndim
        if method in ("contiguous", "clone"):
            return v
        if method in ("transpose", "swapaxes", "swapdims"):
            view, new = LN.permute(shape, D.transpose_order(args, kwargs, rank, what, norm=LN.norm_dim))
        elif method == "t":
            view, new = LN.permute(shape, list(reversed(range(rank))))
        elif method == "permute":
            order = args[0] if len(args) == 1 and isinstance(args[0], (tuple, list)) else args
            order = [LN.norm_dim(d, rank, what) for d in (order or kwargs.get("dims"))]
            if sorted(order) != list(range(rank)):
                raise ScanShapeError(f".permute{tuple(order)} is not a permutation of {rank} dims",
                                     where=self.user_frame())
            view, new = LN.permute(shape, order)
        elif method == "unsqueeze":
            d = args[0] if args else kwargs["dim"]
            view, new = LN.unsqueeze(shape, LN.norm_dim(d, rank + 1, what))
        elif method == "squeeze":
            sel = args[0] if args else kwargs.get("dim")
            if sel is None:
                sel = [i for i, s in enumerate(shape) if s == 1]
            sel = {LN.norm_dim(d, rank, what) for d in (sel if isinstance(sel, (tuple, list)) else [sel])}
            view, new = LN.squeeze(shape, sel)
        elif method in ("reshape", "view", "view_as", "reshape_as", "flatten"):
            if method in ("view_as", "reshape_as"):
                target = tuple(args[0].shape)
            elif method == "flatten":
                target = (math.prod(shape),) if rank else (1,)
                if args or kwargs:
                    start = LN.norm_dim(args[0] if args else kwargs.get("start_dim", 0), rank, what)
                    end = LN.norm_dim(args[1] if len(args) > 1 else kwargs.get("end_dim", -1), rank, what)
                    target = shape[:start] + (math.prod(shape[start:end + 1]),) + shape[end + 1:]
            else:
                target = args[0] if len(args) == 1 and isinstance(args[0], (tuple, list, torch.Size)) else args
            view, new = self._guard(LN.reshape, shape, target, what)
        elif method in ("expand", "broadcast_to", "expand_as"):
            if method == "expand_as":
                sizes = tuple(args[0].shape)
            else:
                sizes = args[0] if len(args) == 1 and isinstance(args[0], (tuple, list, torch.Size)) else args
            view, new = self._guard(LN.expand, shape, tuple(int(s) for s in sizes), what)
        elif method == "narrow":
            dim, start, length = (list(args) + [kwargs.get("dim"), kwargs.get("start"), kwargs.get("length")])[:3]
            view, new = self._guard(LN.narrow, shape, LN.norm_dim(dim, rank, what), start, length, what)
        elif method == "select":
            dim, i = (list(args) + [kwargs.get("dim"), kwargs.get("index")])[:2]
            idx = [slice(None)] * rank
            idx[LN.norm_dim(dim, rank, what)] = i
            view, new = self._guard(LN.index, shape, tuple(idx), what)
        else:
            raise ScanTraceError(f"view method .{method}() is not supported in a scan body", where=self.user_frame())
        return self._viewed(v, view, new)

    def getitem(self, v: TracedTensor, index) -> TracedTensor:
        view, new = self._guard(LN.index, tuple(v.shape), index, "indexing")
        return self._viewed(v, view, new)

    def _guard(self, fn, *args):
        try:
            return fn(*args)
        except ScanError as e:
            if e.where is None:
                raise type(e)(str(e), where=self.user_frame()) from None
            raise

    # ------------------------------------------------------------------ results
    def finish(self, result, shapes, names, what: str) -> list[Node]:
        """Bind the body's results to output nodes of the given row shapes (broadcasting as ``Y[t] = r``)."""
        outs = list(result) if isinstance(result, (tuple, list)) else [result]
        if shapes is not None and len(outs) != len(shapes):
            raise ScanShapeError(f"the {what} returned {len(outs)} value(s) but there are {len(shapes)} state(s) "
                                 f"({', '.join(names)}); return one new row per state, in the order of the "
                                 "body's state parameters (and of init)")
        if shapes is None and not outs:  # post: an empty tuple made evt.scan return () without running anything
            raise ScanTraceError(f"the {what} returned an empty {type(result).__name__}; it must return at least one "
                                 "output row (a traced tensor, or a tuple of them)")
        nodes = []
        for i, v in enumerate(outs):
            if not isinstance(v, TracedTensor) or v.tracer is not self:
                kind = type(v).__name__
                raise ScanTraceError(f"the {what} returned a {kind} at position {i}; expected rows computed from "
                                     "its parameters (a traced tensor per state)")
            if shapes is not None:
                want = tuple(shapes[i])
                try:
                    ok = tuple(torch.broadcast_shapes(tuple(v.shape), want)) == want
                except RuntimeError:
                    ok = False
                if not ok:
                    dims = ["k", *map(str, want)]
                    init_shape = "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"
                    hint = (" (for one init step of rows shaped like these, give init a leading dim of 1: init[None])"
                            if len(v.shape) > len(want) else "")
                    raise ScanShapeError(f"state {i} ({names[i]}): the {what} returned rows of shape "
                                         f"{tuple(v.shape)}, but init gives rows of shape {want}: init's shape is "
                                         f"{init_shape}, its first dim the scan dim (k init steps); the new rows "
                                         f"must have the init rows' shape or broadcast to it{hint}")
                v = self.broadcast(v, want, f"state {i}")
            self.graph.add("output", i, (v.node,), {}, (), v.dtype, Stage.TILE, name=f"out{i}",
                           meta={"where": None, "shape": tuple(v.shape)})
            nodes.append(v)
        return nodes


def optimize(graph: Graph) -> Graph:
    return run_pipeline(graph, passes=[Prune(), CSE(), Simplify(), CSE(), Prune()])


def param_names(fn, n_states: int, n_inputs: int, what: str) -> tuple[list[str], list[str]]:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        raise ScanTraceError(f"{what} {fn!r} has no inspectable signature; pass a Python function") from None
    want = n_states + n_inputs
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    varargs = any(p.kind == p.VAR_POSITIONAL for p in params)
    required = [p for p in positional if p.default is p.empty]
    if not varargs and not (len(required) <= want <= len(positional)):
        raise ScanTraceError(f"{what} {getattr(fn, '__name__', fn)} takes {len(positional)} parameter(s), but "
                             f"evt.scan passes {want}: {n_states} state(s) then {n_inputs} input(s)")
    names = [p.name for p in positional[:want]]
    names += [f"arg{i}" for i in range(len(names), want)]
    return names[:n_states], names[n_states:]


def call_traced(fn, args, what: str):
    """Call the user's function on proxies; turn non-evtorch failures into a ScanTraceError naming it."""
    fname = getattr(fn, "__name__", "body")
    try:
        return fn(*args)
    except (TraceControlFlowError, UnsupportedOpError) as e:
        if isinstance(e, ScanError):
            raise
        # the shared tracer speaks of epilogues; say where this happened instead
        cls = ScanControlFlowError if isinstance(e, TraceControlFlowError) else ScanUnsupportedOpError
        message = str(e).split("\n  at ")[0].replace("an epilogue", f"a {what}").replace("the epilogue", f"the {what}")
        raise cls(message, where=e.where) from None
    except EpilogueError:
        raise
    except Exception as e:  # the body could not run on row proxies
        raise ScanTraceError(f"the {what} {fname} could not be traced: {type(e).__name__}: {e}. A scan body must "
                             "compute the new rows with tensor ops on its parameters (no Python control flow on "
                             "their values, no real tensors from outside)") from e


def check_dtype(name: str, dtype: torch.dtype):
    if dtype not in SUPPORTED_DTYPES:
        raise ScanTraceError(f"{name} has dtype {dtype}, which is not supported; expected a float, integer or bool "
                             "tensor")

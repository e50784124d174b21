"""The epilogue emitter: the tile stage of an optimized graph → one ``@triton.jit`` function.

The function has the template contract's signature (docs/ARCHITECTURE.md)::

    @triton.jit
    def epilogue(acc, offs_m, offs_n, pid_m, pid_n, pid_l, M, N, L, EVEN_M, EVEN_N, INDEX_DTYPE, <params>):

``EVEN_M`` / ``EVEN_N`` are constexprs the launcher sets when M / N is a multiple of the tile's height / width,
so that no row / column of any tile lies outside: the bounds masks are then constant true, and Triton folds them
away (the masked loads and stores become plain ones, ``tl.where(mask, x, identity)`` becomes ``x``): 2-10% of
a ping-pong consumer's epilogue instructions in sm_90 SASS, 2.5-7.6% of the H200's time at 8192x4096x1024
(docs/codegen.md and docs/benchmarks-log.md, "Launch flags").
``INDEX_DTYPE`` (tl.int32 or tl.int64) is the type in which element offsets along M and N are computed: the
launcher picks int32 where every epilogue tensor's offsets over the tiles' index range stay below 2^31 (one
32-bit multiply-add per address instead of 64-bit arithmetic), int64 otherwise; batch and workspace-slot offsets
are always int64.
Inside, every tile value is a Triton tensor broadcastable to the [BLOCK_M, BLOCK_N] tile: varying along M
and N it is [BM, BN], along M only [BM, 1], along N only [1, BN], along neither a scalar (the batch index
is the scalar ``pid_l``). Loads are masked, each output is written once (a value that does not vary along
an axis is stored only by the tiles at index 0 of that axis), and reductions are reduced per tile in
registers and combined across tiles (``codegen.reductions``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..ir.graph import Graph
from ..ir.layouts import output_base_axes
from ..ir.node import Node
from ..ir.types import HALF_DTYPES, Stage
from .expr import TL_DTYPE, compute_expr, converted, literal, op_compute_dtype
from .params import ParamList
from .reductions import IDENTITY, ReductionPlan, key_params

# the launch's specialisations of the epilogue (constexprs every template takes and forwards; see the docstring)
LAUNCH_FLAGS = ("EVEN_M", "EVEN_N", "INDEX_DTYPE")
SIGNATURE = ("acc", "offs_m", "offs_n", "pid_m", "pid_n", "pid_l", "M", "N", "L") + LAUNCH_FLAGS
# the prefetch function's leading parameters (no accumulator, no tile coordinates)
PREFETCH_SIGNATURE = ("offs_m", "offs_n", "pid_l", "M", "N", "L") + LAUNCH_FLAGS


def launch_flags_signature(lang: str) -> str:
    """The launch flags as a kernel's constexpr parameters, ``lang`` the language module's name in the template
    (``tl`` or ``gl``): ``EVEN_M: tl.constexpr, ...``."""
    return ", ".join(f"{flag}: {lang}.constexpr" for flag in LAUNCH_FLAGS)


def _ptr(base: str, axes, strides: dict, extra: str | None = None, flat: bool = False) -> str:
    """Pointer expression over ``axes`` (canonical), shaped like the values of that shape class ([BM, 1] for M
    alone), or with ``flat`` like a reduction result that kept one tile axis ([BM] / [BN])."""
    terms = [base] + ([extra] if extra else [])
    if "L" in axes:
        terms.append(f"pid_l.to(tl.int64) * {strides['L']}")
    if "M" in axes and "N" in axes:
        terms += [f"idx_m[:, None] * {strides['M']}", f"idx_n[None, :] * {strides['N']}"]
    elif "M" in axes:
        terms.append(f"idx_m * {strides['M']}" if flat else f"idx_m[:, None] * {strides['M']}")
    elif "N" in axes:
        terms.append(f"idx_n * {strides['N']}" if flat else f"idx_n[None, :] * {strides['N']}")
    return " + ".join(terms)


def _mask(axes, flat: bool = False) -> str | None:
    """The bounds mask of values over ``axes`` (shaped as in ``_ptr``; ``flat`` for kept-axis results)."""
    if "M" in axes and "N" in axes:
        return "mask"
    if "M" in axes:
        return "mask_m" if flat else "mask_m[:, None]"
    if "N" in axes:
        return "mask_n" if flat else "mask_n[None, :]"
    return None


@dataclass
class EpilogueCode:
    source: str
    fn_name: str
    params: ParamList
    reductions: list[ReductionPlan] = field(default_factory=list)
    user_ops: dict = field(default_factory=dict)   # name -> @triton.jit function to inject into the module
    prefetch: int = 0   # M x N input tiles ``<fn>_prefetch`` loads and ``<fn>_pf`` takes (0: neither exists)
    # per prefetched tile, in ``pf<k>`` order: (pointer param, {axis: stride param}, input name, its dtype), for
    # templates that load the tiles themselves (the ping-pong kernel's TMA loader)
    prefetch_inputs: list = field(default_factory=list)
    # whether the epilogue stores an M x N tile output (a vector, scalar or reduction-only epilogue does not): the
    # tuner offers the wgmma-layout epilogue (EPI_MMA, 4-byte accesses) only where it does not, or where those
    # stores go through TMA
    tile_stores: bool = True
    # the M x N tile outputs a template may store itself by TMA (the ping-pong consumers, TMA_STORE), in the order
    # ``<fn>_st`` / ``<fn>_pf_st`` return them: (pointer param, {axis: stride param}, output position); those two
    # functions exist only when this is not empty
    tma_outputs: list = field(default_factory=list)
    # elementwise operations on M x N tiles other than casts (0: the identity, a plain store of the accumulator,
    # perhaps with broadcast inputs added in other epilogues' counts): the config heuristic keeps the persistent
    # 128x256 kernel for such epilogues where a tile's main loop is long (``policy.epilogue_heuristic``)
    tile_ops: int = 0

    def tma_input(self):
        """The prefetched tile a template may copy by TMA itself (the ping-pong loader, EPI_TMA): the epilogue's
        only M x N input when it is 16-bit with exactly the axes (M, N); its ``prefetch_inputs`` entry, or None."""
        if self.prefetch != 1:
            return None
        entry = self.prefetch_inputs[0]
        return entry if set(entry[1]) == {"M", "N"} and entry[3] in HALF_DTYPES else None


class EpilogueEmitter:
    def __init__(self, graph: Graph, acc_dtype: torch.dtype, deterministic: bool, batched: bool,
                 fn_name: str = "epilogue", params: ParamList | None = None, emissions=None):
        self.graph = graph
        # node -> 'fast' / 'exact': emitted with its op's hardware approximation or exact GPU form
        # (``emissions``: a codegen/fastmath.py ``Emissions``; None, the portable emissions)
        self.emission = {} if emissions is None else {
            id(n): emissions.of(i) for i, n in enumerate(graph.nodes) if emissions.of(i) is not None}
        self.compute = acc_dtype
        self.deterministic = deterministic
        self.batched = batched
        self.fn_name = fn_name
        self.params = params or ParamList()
        self.lines: list[str] = []
        self.var: dict[int, str] = {}
        self.reductions: list[ReductionPlan] = []
        self.user_ops: dict = {}
        self.prefetched: list[Node] = []  # M x N input loads, in ``pf<k>`` order
        self._pf = False  # emitting ``<fn>_pf`` (prefetched loads are arguments)
        self._wide = self._wide_scalars()  # id -> argument name, filled as the scalars are emitted

    def _wide_scalars(self) -> dict:
        """Float scalar inputs below float64 that some tile op computes with in float64 (``acc.double() * s`` in a
        float32 epilogue): eager multiplies by the Python float's double there, so the kernel takes the argument
        as float64 (``ParamList.scalar``), hands it unrounded to those ops and in its own dtype to the others. A
        float32 argument was 1.5e-9 off for s = 0.1 (found by a probe, 2026-11-29). {id: None} until emitted."""
        users = self.graph.users()
        return {id(n): None for n in self.graph.nodes
                if n.op == "scalar" and n.dtype.is_floating_point and n.dtype != torch.float64
                and any(self._computes_in_float64(u) for u in users[id(n)])}

    def _computes_in_float64(self, u: Node) -> bool:
        from ..ops import REGISTRY
        return (u.op == "compute" and u.stage == Stage.TILE and u.target in REGISTRY
                and op_compute_dtype(u, self.compute) == torch.float64)

    def _operand(self, a: Node, user: Node) -> str:
        """``a``'s expression as ``user``'s operand: a float64 argument unrounded where ``user`` computes in
        float64 (``_wide_scalars``)."""
        if self._wide.get(id(a)) is not None and self._computes_in_float64(user):
            return self._wide[id(a)]
        return self.var[id(a)]

    # ------------------------------------------------------------------ planning
    def plan_reductions(self) -> list[ReductionPlan]:
        users = self.graph.users()
        plans = []
        for n in self.graph.nodes:
            if n.op == "reduce" and n.args[0].stage == Stage.TILE:
                mode = "partials" if (self.deterministic or n.target == "logsumexp") else "atomic"
                direct = None
                us = users[id(n)]
                if mode == "atomic" and n.target in ("sum", "mean") and len(us) == 1 and us[0].op == "output" \
                        and output_base_axes(us[0].attrs["dims"]) == n.axes:
                    direct = us[0].target
                plans.append(ReductionPlan(len(plans), n, mode, direct))
        self.reductions = plans
        return plans

    # ------------------------------------------------------------------ emission
    def emit(self) -> EpilogueCode:
        """The epilogue function; with M x N input tiles, also ``<fn>_prefetch`` (loads them) and ``<fn>_pf``
        (the same epilogue taking them as its last arguments): templates that can issue the loads early
        (persistent_tma: before the K loop, or one sub-tile ahead) call the pair instead, so the loads'
        latency and bandwidth overlap tensor-core work instead of stalling the epilogue."""
        if not self.reductions:
            self.plan_reductions()
        self.prefetched = [n for n in self.graph.nodes
                           if n.stage == Stage.TILE and n.op == "input" and {"M", "N"} <= set(n.axes)]
        self.tma_outputs = [n for n in self.graph.nodes if n.op == "output" and n.stage == Stage.TILE
                            and output_base_axes(n.attrs["dims"]) == ("M", "N")]
        source = self._function(self.fn_name, prefetched=False)
        if self.prefetched:
            source += "\n\n" + self._prefetch_function() + "\n\n" + self._function(f"{self.fn_name}_pf", True)
        if self.tma_outputs:
            source += "\n\n" + self._function(f"{self.fn_name}_st", False, returns=True)
            if self.prefetched:
                source += "\n\n" + self._function(f"{self.fn_name}_pf_st", True, returns=True)
        inputs = [(*self._input_params(n), n.target, n.dtype) for n in self.prefetched]
        tile_stores = any(n.op == "output" and n.stage == Stage.TILE
                          and {"M", "N"} <= set(output_base_axes(n.attrs["dims"])) for n in self.graph.nodes)
        stored = [(*self._output_params(n, ("M", "N")), n.target) for n in self.tma_outputs]
        tile_ops = sum(n.op == "compute" and n.stage == Stage.TILE and n.target != "cast" for n in self.graph.nodes)
        return EpilogueCode(source, self.fn_name, self.params, self.reductions, self.user_ops,
                            prefetch=len(self.prefetched), prefetch_inputs=inputs, tile_stores=tile_stores,
                            tma_outputs=stored, tile_ops=tile_ops)

    def _prologue(self) -> None:
        w = self.lines.append
        # constant true when the launcher says every tile is whole along that axis (folded away by Triton)
        w("mask_m = (offs_m < M) | EVEN_M")
        w("mask_n = (offs_n < N) | EVEN_N")
        w("mask = mask_m[:, None] & mask_n[None, :]")
        # element offsets along M and N in the launch's index type (int32 where every tensor allows it)
        w("idx_m = offs_m.to(INDEX_DTYPE)")
        w("idx_n = offs_n.to(INDEX_DTYPE)")

    def _function(self, name: str, prefetched: bool, returns: bool = False) -> str:
        """One epilogue function; ``prefetched``: the M x N input tiles are the arguments ``pf0, pf1, ..``;
        ``returns``: the ``tma_outputs`` are returned (in the output dtype, shaped like ``acc``) instead of
        stored, for a template that stores them through shared memory by TMA."""
        self.lines, self.var, self._pf = [], {}, prefetched
        self._prologue()
        for n in self.graph.nodes:
            if n.stage != Stage.TILE or n.op == "output":
                continue
            self.var[id(n)] = self._emit_node(n)
        for r in self.reductions:
            self._emit_reduction(r)
        returned = []
        for n in self.graph.nodes:
            if n.op == "output" and n.stage == Stage.TILE:
                if returns and n in self.tma_outputs:
                    returned.append(self._returned(n))
                else:
                    self._emit_store(n)
        if returned:
            self.lines.append(f"return {', '.join(returned)}")
        extra = [f"pf{k}" for k in range(len(self.prefetched))] if prefetched else []
        params = ", ".join(list(SIGNATURE) + self.params.names() + extra)
        body = "\n".join(f"    {line}" for line in self.lines) or "    pass"
        return f"@triton.jit\ndef {name}({params}):\n{body}\n"

    def _prefetch_function(self) -> str:
        """``<fn>_prefetch(offs_m, offs_n, pid_l, M, N, L, <LAUNCH_FLAGS>, <params>)``: the M x N input tiles of a
        (sub-)tile, masked like the epilogue's own loads (one tensor, or a tuple in ``pf<k>`` order)."""
        self.lines = []
        self._prologue()
        loads = ", ".join(self._load_expr(n) for n in self.prefetched)
        self.lines.append(f"return {loads}")
        params = ", ".join(list(PREFETCH_SIGNATURE) + self.params.names())
        body = "\n".join(f"    {line}" for line in self.lines)
        return f"@triton.jit\ndef {self.fn_name}_prefetch({params}):\n{body}\n"

    def _assign(self, n: Node, expr: str) -> str:
        name = f"v_{n.name}"
        self.lines.append(f"{name} = {expr}")
        return name

    def _emit_node(self, n: Node) -> str:
        if n.op == "acc":
            return self._assign(n, "acc")
        if n.op == "const":
            return literal(n.target, self.compute) if n.target is not None else 'float("nan")'
        if n.op == "scalar":
            if id(n) not in self._wide:
                return self.params.scalar(n)
            name = self._wide[id(n)] = self.params.scalar(n, wide=True)
            return f"{name}.to({TL_DTYPE[n.dtype]})"
        if n.op == "index":
            return {"M": "offs_m[:, None]", "N": "offs_n[None, :]", "L": "pid_l"}[n.target]
        if n.op == "input":
            return self._emit_load(n)
        if n.op == "compute":
            from ..ops import REGISTRY
            op = REGISTRY[n.target]
            if op.user_defined is not None:
                self.user_ops[op.name] = op.user_defined
            return self._assign(n, compute_expr(n, [self._operand(a, n) for a in n.args], self.compute,
                                                self.emission.get(id(n))))
        raise AssertionError(f"unexpected tile node {n.format()}")

    def _emit_load(self, n: Node) -> str:
        if self._pf:
            k = next((k for k, m in enumerate(self.prefetched) if m is n), None)
            if k is not None:
                return self._assign(n, f"pf{k}")
        return self._assign(n, self._load_expr(n))

    def _input_params(self, n: Node) -> tuple[str, dict]:
        """An input's pointer parameter and {axis: stride parameter}."""
        ptr = self.params.get("in_ptr", n.target, f"in_{n.target}")
        binding = n.attrs["binding"]
        return ptr, {a: self.params.get("in_stride", (n.target, binding, a), f"s_{n.target}_{a}") for a in n.axes}

    def _load_expr(self, n: Node) -> str:
        ptr, strides = self._input_params(n)
        mask = _mask(n.axes)
        address = _ptr(ptr, n.axes, strides)
        other = "0" if not n.dtype.is_floating_point else "0.0"
        if n.dtype == torch.bool:
            other = "0"
        return f"tl.load({address}, mask={mask}, other={other})" if mask else f"tl.load({address})"

    def _output_params(self, out: Node, base_axes) -> tuple[str, dict]:
        """An output's pointer parameter and {axis: stride parameter} over its base axes."""
        pos = out.target
        ptr = self.params.get("out_ptr", pos, f"out{pos}")
        return ptr, {a: self.params.get("out_stride", (pos, a), f"so{pos}_{a}") for a in base_axes}

    def _returned(self, out: Node) -> str:
        """The value of a TMA-stored M x N output as ``<fn>_st`` returns it: in the output's dtype, broadcast to
        the slice where it varies along fewer axes (the template writes it into a [BM, BN] shared buffer)."""
        ptr, _ = self._output_params(out, ("M", "N"))
        value = self.var[id(out.args[0])]
        if not {"M", "N"} <= set(out.args[0].axes):
            value = (f"tl.broadcast_to({value}, acc.shape)" if {"M", "N"} & set(out.args[0].axes)
                     else f"(tl.zeros_like(acc) + {value})")
        return f"{value}.to({ptr}.dtype.element_ty)"

    def _emit_store(self, out: Node) -> None:
        base_axes = output_base_axes(out.attrs["dims"])
        ptr, strides = self._output_params(out, base_axes)
        value = self.var[id(out.args[0])]
        guards = [_mask(base_axes)] if _mask(base_axes) else []
        # tiles that would store a copy of the same elements leave it to tile 0 of that axis; guards are
        # shaped like the stored block (the interpreter refuses a tensor mask combined with a scalar one)
        zero = _zero_like(base_axes)
        if "M" not in base_axes:
            guards.append(f"(({zero}pid_m) == 0)")
        if "N" not in base_axes:
            guards.append(f"(({zero}pid_n) == 0)")
        if "L" not in base_axes and self.batched:
            guards.append(f"(({zero}pid_l) == 0)")
        address = _ptr(ptr, base_axes, strides)
        mask = " & ".join(guards) if guards else None
        v = converted(value, out.args[0], f"{ptr}.dtype.element_ty")
        if base_axes == () or set(base_axes) <= {"L"}:
            self.lines.append(f"tl.store({address}, {v}, mask={mask})" if mask else f"tl.store({address}, {v})")
        else:
            # broadcast explicitly: the value may vary along fewer axes than the stored block
            self.lines.append(f"tl.store({address}, tl.broadcast_to({v}, ({address}).shape), mask={mask})")

    # ------------------------------------------------------------------ cross-tile reductions
    def _emit_reduction(self, r: ReductionPlan) -> None:
        w = self.lines.append
        src = self.var[id(r.node.args[0])]
        rid = r.rid
        x = f"x{rid}"
        tl_f = TL_DTYPE[r.dtype]
        # The reduction walks the axes its value's dims span (reduced or kept), not the whole tile: along a tile
        # axis outside that set the value is constant, and only tiles at index 0 of that axis may contribute.
        over, kept = set(r.over), r.kept
        span = over | set(kept) | set(r.node.args[0].axes)
        present = tuple(a for a in ("M", "N") if a in span)
        shape = {("M", "N"): None, ("M",): "(acc.shape[0], 1)", ("N",): "(1, acc.shape[1])", (): "(1, 1)"}[present]
        value = converted(src, r.node.args[0], tl_f)
        if not (shape is None and set(r.node.args[0].axes) >= {"M", "N"}):
            value += " + " + ("tl.zeros_like(acc)" if shape is None else f"tl.zeros({shape}, {tl_f})")
        conds = [_mask(present)] if _mask(present) else []
        guards = [f"(pid_{a.lower()} == 0)" for a in ("M", "N") if a not in span]
        if self.batched and "L" not in span:
            guards.append("(pid_l == 0)")
        self._guard = " & ".join(guards) or None  # the combine step (atomic or partial store) runs under it
        if conds:
            w(f"{x} = tl.where({' & '.join(conds)}, {value}, {literal(IDENTITY[r.op])})")
        else:
            w(f"{x} = {value}")
        if "M" in kept and "N" in kept:
            axis = None
        elif "M" in kept:
            axis = 1
        elif "N" in kept:
            axis = 0
        else:
            axis = "all"
        kmask = _mask(kept, flat=True)

        def reduce(expr, fn):
            """``fn``: sum, or max / min with NaN winning (torch's amax / amin / logsumexp propagate it; tl.max
            drops it), reduced as floats: one max.NaN per element on the GPU."""
            if axis is None:
                return expr
            if fn == "sum":
                return f"tl.sum({expr})" if axis == "all" else f"tl.sum({expr}, axis={axis})"
            return f"tl.reduce({expr}, {'None' if axis == 'all' else axis}, tlmath.{fn}_nan)"

        if r.op == "logsumexp":
            w(f"m{rid} = {reduce(x, 'max')}")
            # an infinite max (all -inf, or a +inf element) shifts by 0: exp(x - m) would be exp(inf - inf) = NaN
            w(f"ms{rid} = tl.where(tl.abs(m{rid}) == float('inf'), 0.0, m{rid})")
            ms = f"ms{rid}" if axis is None else (f"ms{rid}[:, None]" if axis == 1 else
                                                  f"ms{rid}[None, :]" if axis == 0 else f"ms{rid}")
            w(f"s{rid} = {reduce(f'tl.exp({x} - {ms})', 'sum')}")
            for part, val in (("max", f"m{rid}"), ("sum", f"s{rid}")):
                self._store_partial(r, part, val, kmask)
            return
        if r.op in ("amax", "amin"):
            # reduced as floats; only the per-tile result becomes the ordered integer key the atomics compare
            fn = "max" if r.op == "amax" else "min"
            w(f"p{rid} = {reduce(x, fn)}")
            if r.mode == "atomic":
                _, itype, shift, mask_bits, kmin, kmax = key_params(r.dtype)
                nan_key = kmax if r.op == "amax" else kmin
                w(f"k{rid} = tl.where(p{rid} != p{rid}, {nan_key}, "
                  f"tlmath.float_to_key(p{rid}, {itype}, {shift}, {mask_bits}))")
                self._atomic(r, f"tl.atomic_{fn}", f"k{rid}", kmask)
            else:
                self._store_partial(r, "val", f"p{rid}", kmask)
            return
        w(f"p{rid} = {reduce(x, 'sum')}")
        if r.mode == "atomic":
            if r.op == "mean" and r.direct_output is not None:
                # 1/n is a Python float, which Triton passes as fp32 unless the signature says tl.float64
                inv = self.params.get("count", (rid, "inv"), f"inv_count{rid}",
                                      "tl.float64" if self.compute == torch.float64 else "")
                w(f"p{rid} = p{rid} * {inv}")
            self._atomic(r, "tl.atomic_add", f"p{rid}", kmask)
        else:
            self._store_partial(r, "val", f"p{rid}", kmask)

    def _buffer(self, r: ReductionPlan, part: str):
        if r.direct_output is not None:
            pos = r.direct_output
            ptr = self.params.get("out_ptr", pos, f"out{pos}")
            strides = {a: self.params.get("out_stride", (pos, a), f"so{pos}_{a}") for a in r.kept}
            return ptr, strides
        ptr = self.params.get("buf_ptr", (r.rid, part), f"red{r.rid}_{part}")
        axes = r.kept + (("T",) if r.mode == "partials" else ())
        strides = {a: self.params.get("buf_stride", (r.rid, a), f"rs{r.rid}_{a}") for a in axes}
        return ptr, strides

    def _atomic(self, r: ReductionPlan, fn: str, value: str, kmask: str | None) -> None:
        ptr, strides = self._buffer(r, "val")
        address = _ptr(ptr, r.kept, strides, flat=True)
        mask = f", mask={kmask}" if kmask else ""
        self._guarded(f'{fn}({address}, {value}{mask}, sem="relaxed")')

    def _guarded(self, line: str) -> None:
        if self._guard:
            self.lines.append(f"if {self._guard}:")
            line = "    " + line
        self.lines.append(line)

    def _store_partial(self, r: ReductionPlan, part: str, value: str, kmask: str | None) -> None:
        ptr, strides = self._buffer(r, part)
        t = _tile_linear_index(r.over)
        address = _ptr(ptr, r.kept, strides, extra=f"({t}).to(tl.int64) * {strides['T']}", flat=True)
        if "N" in r.over:
            # The workspace has cdiv(N, tile width) slots along N. With epilogue sub-tiling a ragged last tile can
            # hand over a sub-tile that lies wholly past N (pid_n = cdiv(N, width) or more): it holds only the
            # identity and must not write, or it would land past the workspace (or in the next row's slots).
            inside = "(pid_n * acc.shape[1] < N)"
            zero = {"mask": "offs_m[:, None] * 0 + offs_n[None, :] * 0 + ", "mask_m": "offs_m * 0 + ",
                    "mask_n": "offs_n * 0 + "}.get(kmask, "")
            guard = f"(({zero}pid_n * acc.shape[1]) < N)" if zero else inside
            kmask = f"{kmask} & {guard}" if kmask else guard
        mask = f", mask={kmask}" if kmask else ""
        self._guarded(f"tl.store({address}, {value}{mask})")


def _zero_like(axes) -> str:
    """A zero-valued expression prefix shaped like values of ``axes`` ('' for scalars)."""
    if "M" in axes and "N" in axes:
        return "offs_m[:, None] * 0 + offs_n[None, :] * 0 + "
    if "M" in axes:
        return "offs_m[:, None] * 0 + "
    if "N" in axes:
        return "offs_n[None, :] * 0 + "
    return ""


def _tile_linear_index(over) -> str:
    """Row-major index of this tile among the tiles along the reduced axes (canonical order)."""
    count = {"L": "L", "M": "tl.cdiv(M, acc.shape[0])", "N": "tl.cdiv(N, acc.shape[1])"}
    pid = {"L": "pid_l", "M": "pid_m", "N": "pid_n"}
    expr = None
    for a in ("L", "M", "N"):
        if a in over:
            expr = pid[a] if expr is None else f"({expr}) * {count[a]} + {pid[a]}"
    return expr or "0"

"""The vector-stage emitter: finalize cross-tile reductions and compute what depends on them.

Runs after the GEMM as one small kernel over the *vector domain*: the axes the vector values walk (at most
L and one of M/N, or (M, N) for reductions over the batch only). Its work, per element block:

1. finalize each tile reduction: decode atomic buffers (float keys of amax/amin; mean = sum / count) or combine
   the per-tile partials in a fixed order (deterministic mode; logsumexp's online (max, sum-exp) pairs);
2. compute vector-stage nodes (e.g. ``(lse - target_logit)``) from those and from vector-stage input loads;
3. reductions *within* the vector stage (e.g. ``.mean()`` of that) run in phases: the kernel is then a single
   program that sweeps the domain once per phase, accumulating into scratch buffers that the next phase reads
   (a single program keeps the accumulation order fixed, so results are deterministic);
4. store the vector outputs.

Without vector-stage reductions it is one phase on a grid over the domain.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..ir.graph import Graph
from ..ir.layouts import output_base_axes
from ..ir.node import Node
from ..ir.types import AXES, Stage
from .expr import TL_DTYPE, compute_expr, converted, literal
from .gemm_template import jit_decorator
from .params import ParamList
from .reductions import IDENTITY, ReductionPlan, key_params

VBLOCK = 1024


@dataclass
class InnerReduction:
    """A reduction whose input is itself a vector value, accumulated into a scratch buffer."""

    rid: str
    node: Node
    phase: int                 # phase in which its input is computed (logsumexp: max then, sum-exp in phase+1)

    def parts(self):
        return ("max", "sum") if self.node.target == "logsumexp" else ("val",)

    def buffer_dtype(self, part):
        if self.node.target in ("amax", "amin") or part == "max":
            return key_params(self.node.dtype)[0]
        return self.node.dtype

    def init_value(self, part):
        from .reductions import float_key
        if self.node.target in ("amax", "amin"):
            return float_key(IDENTITY[self.node.target], self.node.dtype)
        if part == "max":
            return float_key(float("-inf"), self.node.dtype)
        return 0.0


@dataclass
class VectorCode:
    source: str
    fn_name: str
    params: ParamList
    domain: tuple[str, ...]
    phases: int
    inner: list[InnerReduction] = field(default_factory=list)
    task_domains: list = field(default_factory=list)   # single-phase: the domain of each output task

    @property
    def single_program(self) -> bool:
        return self.phases > 1


def needed_vector_nodes(graph: Graph, plans: list[ReductionPlan]) -> list[Node]:
    """Vector-stage nodes the vector kernel must compute (outputs not accumulated directly, and what they use)."""
    direct = {p.direct_output for p in plans if p.direct_output is not None}
    need: set[int] = set()
    for n in reversed(graph.nodes):
        if n.op == "output" and n.stage == Stage.VECTOR and n.target not in direct:
            need.add(id(n))
        if id(n) in need and n.stage == Stage.VECTOR:
            if n.op == "reduce" and n.args[0].stage == Stage.TILE:
                continue
            need.update(id(a) for a in n.args)
    return [n for n in graph.nodes if id(n) in need]


class VectorEmitter:
    def __init__(self, graph: Graph, plans: list[ReductionPlan], acc_dtype: torch.dtype,
                 fn_name: str = "vector_stage"):
        self.graph = graph
        self.plans = {id(p.node): p for p in plans}
        self.compute = acc_dtype
        self.fn_name = fn_name
        self.params = ParamList()
        self.nodes = needed_vector_nodes(graph, plans)
        self.lines: list[str] = []
        self.indent = 1

    def empty(self) -> bool:
        return not self.nodes

    # ------------------------------------------------------------------ planning
    def _plan(self):
        self.avail: dict[int, int] = {}
        self.inner: list[InnerReduction] = []
        for n in self.nodes:
            if id(n) in self.plans:  # tile reductions are finished before the vector stage starts
                self.avail[id(n)] = 0
            elif n.op == "reduce":
                p = self.avail[id(n.args[0])]
                r = InnerReduction(f"v{len(self.inner)}", n, p)
                self.inner.append(r)
                self.avail[id(n)] = p + (2 if n.target == "logsumexp" else 1)
            elif n.op == "output":
                self.avail[id(n)] = self.avail[id(n.args[0])]
            else:
                self.avail[id(n)] = max([self.avail[id(a)] for a in n.args], default=0)
        self.phases = 1 + max(self.avail.values(), default=0)
        axes = set()
        for n in self.nodes:
            axes |= set(n.axes)
            if n.op == "output":
                axes |= set(output_base_axes(n.attrs["dims"]))
        self.domain = tuple(a for a in AXES if a in axes)  # the union, reported; each task loops over its own

    def _set_domain(self, axes) -> None:
        """Make ``axes`` (canonical) the domain the next emitted task walks."""
        self.task_domain = tuple(a for a in AXES if a in set(axes))
        self.vaxes = tuple(a for a in self.task_domain if a != "L")

    def _task_domain(self, task: Node):
        if task.op == "output":
            return set(output_base_axes(task.attrs["dims"])) | set(task.args[0].axes)
        return set(task.args[0].axes) | set(task.attrs["over"]) | set(task.axes)

    def _v_size(self) -> str:
        return " * ".join(self.vaxes) or "1"

    # ------------------------------------------------------------------ emission helpers
    def w(self, line: str):
        self.lines.append("    " * self.indent + line)

    def _coords(self, valid: str | None = None):
        size = {"M": "M", "N": "N"}
        self.w("v = vb * VBLOCK + tl.arange(0, VBLOCK)")
        self.w(f"vmask = (v < ({self._v_size()}))" + (f" & ((v * 0 + {valid}) != 0)" if valid else ""))
        rest = "v"
        for a in reversed(self.vaxes):
            if a == self.vaxes[0]:
                self.w(f"c_{a} = ({rest}).to(tl.int64)")
            else:
                self.w(f"c_{a} = ({rest} % {size[a]}).to(tl.int64)")
                rest = f"({rest} // {size[a]})"

    def _address(self, ptr: str, axes, strides: dict) -> str:
        terms = [ptr]
        if "L" in axes:
            terms.append(f"tl.cast(l, tl.int64) * {strides['L']}")
        terms += [f"c_{a} * {strides[a]}" for a in self.vaxes if a in axes]
        return " + ".join(terms)

    def _vmask(self, axes) -> str | None:
        return "vmask" if any(a in axes for a in self.vaxes) else None

    def _assign(self, n: Node, expr: str, env: dict) -> str:
        name = f"v_{n.name}"
        self.w(f"{name} = {expr}")
        env[id(n)] = name
        return name

    # ------------------------------------------------------------------ node values
    def _value(self, n: Node, env: dict, phase: int) -> str:
        if id(n) in env:
            return env[id(n)]
        if n.op == "const":
            env[id(n)] = literal(n.target, self.compute)
            return env[id(n)]
        if n.op == "scalar":
            env[id(n)] = self.params.scalar(n)
            return env[id(n)]
        if n.op == "input":
            ptr = self.params.get("in_ptr", n.target, f"in_{n.target}")
            strides = {a: self.params.get("in_stride", (n.target, n.attrs["binding"], a), f"s_{n.target}_{a}")
                       for a in n.axes}
            mask = self._vmask(n.axes)
            addr = self._address(ptr, n.axes, strides)
            return self._assign(n, f"tl.load({addr}, mask={mask}, other=0)" if mask else f"tl.load({addr})", env)
        if n.op == "compute":
            args = [self._value(a, env, phase) for a in n.args]
            return self._assign(n, compute_expr(n, args, self.compute), env)
        if n.op == "reduce" and id(n) in self.plans:
            return self._finalize_tile_reduction(self.plans[id(n)], env)
        if n.op == "reduce":
            return self._read_inner(next(r for r in self.inner if r.node is n), env)
        raise AssertionError(f"unexpected vector node {n.format()}")

    def _finalize_tile_reduction(self, r: ReductionPlan, env: dict) -> str:
        rid = r.rid
        tl_f = TL_DTYPE[r.dtype]
        mask = self._vmask(r.kept)
        m = f", mask={mask}, other=0" if mask else ""

        def buf(part):
            ptr = self.params.get("buf_ptr", (rid, part), f"red{rid}_{part}")
            axes = r.kept + (("T",) if r.mode == "partials" else ())
            strides = {a: self.params.get("buf_stride", (rid, a), f"rs{rid}_{a}") for a in axes}
            return ptr, strides

        out = f"r{rid}"
        if r.mode == "atomic":
            ptr, strides = buf("val")
            self.w(f"{out} = tl.load({self._address(ptr, r.kept, strides)}{m})")
            if r.op in ("amax", "amin"):
                _, _, shift, mask_bits, _, _ = key_params(r.dtype)
                self.w(f"{out} = tlmath.key_to_float({out}, {tl_f}, {shift}, {mask_bits})")
        else:
            T = self.params.get("count", (rid, "T"), f"tiles{rid}")
            if r.op == "logsumexp":
                pm, sm = buf("max"), buf("sum")
                self.w(f"mx{rid} = tl.full([VBLOCK], float('-inf'), {tl_f})")
                self.w(f"for t in range(0, {T}):")
                self.w(f"    mt = tl.load({self._address(pm[0], r.kept, pm[1])} + t * {pm[1]['T']}{m})")
                self.w(f"    mx{rid} = tlmath.max_nan(mt, mx{rid})")  # NaN sticks, whichever tile has it
                self.w(f"ms{rid} = tl.where(mx{rid} == float('-inf'), 0.0, mx{rid})")
                self.w(f"sm{rid} = tl.zeros([VBLOCK], {tl_f})")
                self.w(f"for t in range(0, {T}):")
                self.w(f"    mt = tl.load({self._address(pm[0], r.kept, pm[1])} + t * {pm[1]['T']}{m})")
                self.w(f"    st = tl.load({self._address(sm[0], r.kept, sm[1])} + t * {sm[1]['T']}{m})")
                self.w(f"    sm{rid} += st * tl.exp(tl.where(mt == float('-inf'), float('-inf'), mt - ms{rid}))")
                self.w(f"{out} = ms{rid} + tl.log(sm{rid})")
                # logsumexp is -inf for all -inf and +inf with a +inf element (the sum above is NaN there)
                self.w(f"{out} = tl.where(tl.abs(mx{rid}) == float('inf'), mx{rid}, {out})")
            else:
                ptr, strides = buf("val")
                first = f"tl.load({self._address(ptr, r.kept, strides)}{m})"
                self.w(f"{out} = {first}")
                self.w(f"for t in range(1, {T}):")
                nxt = f"tl.load({self._address(ptr, r.kept, strides)} + t * {strides['T']}{m})"
                if r.op in ("sum", "mean"):
                    self.w(f"    {out} += {nxt}")
                else:
                    fn = "maximum" if r.op == "amax" else "minimum"
                    self.w(f"    {out} = tlmath.{fn}({out}, {nxt})")
        if r.op == "mean":
            cnt = self.params.get("count", (rid, "n"), f"count{rid}")
            self.w(f"{out} = {out} / {cnt}")
        env[id(r.node)] = out
        return out

    def _inner_buf(self, r: InnerReduction, part: str):
        ptr = self.params.get("buf_ptr", (r.rid, part), f"red{r.rid}_{part}")
        strides = {a: self.params.get("buf_stride", (r.rid, a), f"rs{r.rid}_{a}") for a in r.node.axes}
        return ptr, strides

    def _read_inner(self, r: InnerReduction, env: dict) -> str:
        n = r.node
        tl_f = TL_DTYPE[n.dtype]
        mask = self._vmask(n.axes)
        m = f", mask={mask}, other=0" if mask else ""
        _, _, shift, mask_bits, _, _ = key_params(n.dtype)
        ptr, strides = self._inner_buf(r, r.parts()[0])
        out = f"r{r.rid}"
        self.w(f"{out} = tl.load({self._address(ptr, n.axes, strides)}{m}, volatile=True)")
        if n.target in ("amax", "amin") or n.target == "logsumexp":
            self.w(f"{out} = tlmath.key_to_float({out}, {tl_f}, {shift}, {mask_bits})")
        if n.target == "logsumexp":
            sp, ss = self._inner_buf(r, "sum")
            self.w(f"{out}_s = tl.load({self._address(sp, n.axes, ss)}{m}, volatile=True)")
            self.w(f"{out} = tl.where({out} == float('-inf'), {out}, {out} + tl.log({out}_s))")
        if n.target == "mean":
            cnt = self.params.get("count", (r.rid, "n"), f"count{r.rid}")
            self.w(f"{out} = {out} / {cnt}")
        env[id(n)] = out
        return out

    def _accumulate(self, r: InnerReduction, env: dict, phase: int):
        n = r.node
        src = self._value(n.args[0], env, phase)
        tl_f = TL_DTYPE[n.dtype]
        # a block reduces to one value unless it stores per element of a kept vector axis
        over_v = not any(a in n.axes for a in self.vaxes)
        x = f"a{r.rid}"
        ident = IDENTITY[n.target]
        self.w(f"{x} = tl.where(vmask, {src}.to({tl_f}) + tl.zeros([VBLOCK], {tl_f}), {literal(ident)})")
        kmask = self._vmask(n.axes)
        km = f", mask={kmask}" if kmask else ""
        red = (lambda e, fn: f"tl.{fn}({e})") if over_v else (lambda e, fn: e)
        _, itype, shift, mask_bits, kmin, kmax = key_params(n.dtype)
        if n.target in ("sum", "mean") or (n.target == "logsumexp" and phase == r.phase + 1):
            if n.target == "logsumexp":
                ptr, strides = self._inner_buf(r, "max")
                mm = f", mask={kmask}, other=0" if kmask else ""
                self.w(f"mx = tlmath.key_to_float(tl.load({self._address(ptr, n.axes, strides)}{mm}, volatile=True), "
                       f"{tl_f}, {shift}, {mask_bits})")
                self.w("mx = tl.where(tl.abs(mx) == float('inf'), 0.0, mx)")  # exp(inf - inf) would be NaN
                self.w(f"{x} = tl.exp({x} - mx)")
                ptr, strides = self._inner_buf(r, "sum")
            else:
                ptr, strides = self._inner_buf(r, "val")
            self.w(f"tl.atomic_add({self._address(ptr, n.axes, strides)}, {red(x, 'sum')}{km})")
            return
        fn = "max" if n.target in ("amax", "logsumexp") else "min"
        nan_key = kmax if fn == "max" else kmin
        self.w(f"k{r.rid} = tl.where({x} != {x}, {nan_key}, tlmath.float_to_key({x}, {itype}, {shift}, {mask_bits}))")
        ptr, strides = self._inner_buf(r, "max" if n.target == "logsumexp" else "val")
        self.w(f"tl.atomic_{fn}({self._address(ptr, n.axes, strides)}, {red(f'k{r.rid}', fn)}{km})")

    def _store_output(self, out: Node, env: dict, phase: int):
        pos = out.target
        base = output_base_axes(out.attrs["dims"])
        ptr = self.params.get("out_ptr", pos, f"out{pos}")
        strides = {a: self.params.get("out_stride", (pos, a), f"so{pos}_{a}") for a in base}
        value = self._value(out.args[0], env, phase)
        guards = ["vmask"]
        guards += [f"(c_{a} == 0)" for a in self.vaxes if a not in base]
        if "L" in self.task_domain and "L" not in base:
            guards.append("((v * 0 + l) == 0)")  # a tensor: the interpreter refuses tensor & scalar masks
        addr = self._address(ptr, base, strides) + " + v * 0"
        cast = converted(f"({value})", out.args[0], f"{ptr}.dtype.element_ty")
        self.w(f"tl.store({addr}, tl.broadcast_to({cast}, [VBLOCK]), "
               f"mask={' & '.join(guards)})")

    # ------------------------------------------------------------------ the kernel
    def emit(self) -> VectorCode:
        self._plan()
        outputs = [n for n in self.nodes if n.op == "output"]
        if self.phases == 1:
            # one program per element block of the largest task; each task masks the blocks it lacks
            self.w("pid = tl.program_id(0)")
            self.task_domains = []
            for o in outputs:
                self._set_domain(self._task_domain(o))
                self.task_domains.append(self.task_domain)
                self.w(f"# output {o.target} over {''.join(self.task_domain) or 'a scalar'}")
                self.w(f"nvb = tl.cdiv({self._v_size()}, VBLOCK)")
                self.w("l = pid // nvb" if "L" in self.task_domain else "l = pid // nvb")
                self.w("vb = pid % nvb")
                self._coords(valid=f"(l < {'L' if 'L' in self.task_domain else '1'})")
                self._store_output(o, {}, 0)
        else:
            # a single program sweeps each task's domain once per phase; scratch accumulations of one phase
            # are read by the next, after a barrier
            for phase in range(self.phases):
                tasks = [r.node for r in self.inner
                         if r.phase == phase or (r.node.target == "logsumexp" and r.phase + 1 == phase)]
                if phase == self.phases - 1:
                    tasks += outputs
                for task in tasks:
                    self._set_domain(self._task_domain(task))
                    self.w(f"# phase {phase}: {'store output ' + str(task.target) if task.op == 'output' else 'accumulate %' + task.name}")
                    self.w("for l in range(0, L):" if "L" in self.task_domain else "for l in range(0, 1):")
                    self.indent += 1
                    self.w(f"for vb in range(0, tl.cdiv({self._v_size()}, VBLOCK)):")
                    self.indent += 1
                    self._coords()
                    if task.op == "output":
                        self._store_output(task, {}, phase)
                    else:
                        self._accumulate(next(r for r in self.inner if r.node is task), {}, phase)
                    self.indent -= 2
                self.w("tl.debug_barrier()")
        params = ", ".join(["L", "M", "N"] + self.params.signature() + ["VBLOCK: tl.constexpr"])
        decorator = jit_decorator(self.params.names("scalar"), self.params.names())
        source = f"{decorator}\ndef {self.fn_name}({params}):\n" + "\n".join(self.lines) + "\n"
        return VectorCode(source, self.fn_name, self.params, self.domain, self.phases, self.inner,
                          getattr(self, "task_domains", []))

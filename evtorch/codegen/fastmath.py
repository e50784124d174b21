"""The fast-math path: where a generated epilogue may use hardware approximations (tanh, sigmoid, logsigmoid).

The accurate emissions (``tlmath.tanh``, ``tlmath.sigmoid``: exp + divide + polynomial + selects, about 27 and 17
instructions) are the only ones the interpreter can run. On a GPU, ops with an ``OpDef.triton_fast`` emission may use
it instead, node by node, when this rule allows. Measured on an H200 (``benchmarks/fastmath_check.py``, 8M points in
[-30, 30] against float64): tanh as ``tanh.approx.f32`` (one MUFU.TANH; the PTX ISA promises about 2^-11 relative)
max relative error 1.1e-5 (``tlmath.tanh`` 6.1e-7); sigmoid as ``ex2.approx`` + ``rcp.approx`` 1.79e-6, the same as
``tlmath.sigmoid`` (1.75e-6), which is why sigmoid's is marked ``fast_exact``; logsigmoid's (the same two MUFU
ops for its exp and divide) 1.75e-6 as its accurate one (``benchmarks/ab_check.py --approximations``): ``fast_exact``.

**The rule (mode ``auto``).** An op whose fast emission is ``fast_exact`` uses it everywhere. Any other node may be
approximated when its value is rounded to 16 bits before it can reach any output at a higher precision. Walking
from the node along its uses, through continuous float ops only, every path must reach either

- a value whose IR dtype is float16 / bfloat16 (the epilogue itself rounds there, as eager does: ``tanh(beta * C)``
  with a bf16 ``C`` is a bf16 value; the node itself counts when it is one), or
- a full-size output stored as float16 / bfloat16 (``out_dtype``, by default ``A.dtype``).

A path that reaches a reduction (reductions run in float32 and produce float32 outputs), a float32 / float64
output, the vector stage, or a discontinuous op (comparisons, floor/ceil/round/sign, casts to integers or bool,
user ops) keeps the node accurate: a float32 output promises more than the approximation gives, a sum of N
approximations accumulates their errors, a comparison can flip. The 16-bit rounding (unit roundoff 2^-9 for bf16,
2^-11 for fp16) is far larger than the approximation error, so a stored value is within one 16-bit ulp of the
accurate one, and most are equal. Arithmetic between the approximation and the rounding can amplify the error (the
derivative of tanh-GELU multiplies it by up to ~17 for |x| in 1-5; ``1 + tanh(u)`` cancels for u << 0), which
shows as more values rounding one ulp the other way: on the H200, dgelu_bgrad's max error went from 2.7e-3 to
7.6e-3 (torch.compile: 8.0e-3; one bf16 ulp of gelu' in [1, 2) is 7.8e-3) and its fp32 column sum from 1e-6 to
4.8e-4 of its largest value, about the noise that the program's own bf16 rounding of gelu' puts there.

**Exact GPU forms.** An op may also have an ``OpDef.triton_gpu`` emission: its accurate computation in a form only
a GPU runs. ``tlmath.tanh_gpu``: ``tanh`` with the range fix-ups its operands never need left out, its ex2 and
reciprocal as bare MUFU ops in inline PTX (27 -> 21 SASS instructions a value, the same bits), for float32
computations. ``tlmath.pow_gpu``: libdevice's pow, for float64 computations only, where it gave eager's bits on an
H200 for every exponent tried (2.7, -1.3, 0.33, 1.5, 4, -3, -4, 5, 33, -35: the portable form is up to some hundred
float64 ulps off, having no wider type to compute in); in float32 libdevice's powf differed from eager's in 40% of
the values (one or two ulps, H200, Triton 3.6, 2026-11-29), so float32 keeps the portable float64 route (within an
ulp of eager's on the CPU; on a GPU, where eager's powf is itself up to two ulps off, not yet measured). Each op
names the computes its form serves (``OpDef.triton_gpu_computes``). Being no approximation, a GPU form is used on
every node of such an op that does not take ``triton_fast``, in ``auto`` and ``always``: a tanh that feeds a
float32 output or a sum (the backward's GELU derivative ahead of the bias gradient). ``never`` keeps the portable
emissions.

Modes (``EVTORCH_FAST_MATH``): ``auto`` (the rule, default), ``always`` (every op with a fast emission, whatever
the output precision), ``never``. Whatever the mode: only fp32 compute is approximated or reassociated (fp64
epilogues take only the exact GPU forms), and the runtime asks
for it only for CUDA tensors on an NVIDIA GPU of compute capability >= 7.5 and never under the interpreter
(``runtime/gemm.py``). The chosen nodes enter the program's hash (``program_hash``), so a program, its module
file, its autotuning key and its launches are never shared between the two emissions.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from ..ir.graph import Graph
from ..ir.types import HALF_DTYPES, Stage
from ..ops import REGISTRY
from ..passes.intermediates import continuous, eager_dtype, reaching_discontinuities
from ..passes.reassociate import arithmetic, reassociate
from ..runtime import knobs

MODES = ("auto", "always", "never")
ROUNDING_DTYPES = HALF_DTYPES


def resolve_mode(fast_math) -> str:
    """A mode from ``build_program``'s ``fast_math`` argument: None decides as the runtime does on a GPU (the
    ``EVTORCH_FAST_MATH`` knob, 'never' under the interpreter); True is 'auto', False 'never'."""
    if fast_math is None:
        return "never" if knobs.interpreter_active() else knobs.fast_math_mode()
    if fast_math is True:
        return "auto"
    if fast_math is False:
        return "never"
    if fast_math not in MODES:
        raise ValueError(f"fast_math must be one of {', '.join(MODES)} (or a bool / None), got {fast_math!r}")
    return fast_math


def has_emission(n, emission: str) -> bool:
    """Whether tile node ``n``'s op has the GPU-only emission ``emission`` (an ``OpDef`` field)."""
    if n.op != "compute" or n.stage != Stage.TILE or n.target not in REGISTRY:
        return False
    op = REGISTRY[n.target]
    form = getattr(op, emission)
    if form is None or op.user_defined is not None:
        return False
    # a callable emission may have none for some attributes (pow's GPU form: none for the exponents eager
    # computes without pow), and a node emitted as the portable form must not count as a GPU-only one
    return not callable(form) or form(**{k: n.attrs[k] for k in op.attr_names if k in n.attrs}) is not None


def rounded_nodes(graph: Graph, output_dtypes: dict, any_precision: bool = False) -> frozenset:
    """Indices of the nodes whose every path to an output meets a 16-bit rounding first (through continuous ops):
    the nodes the rule lets use an approximation, and the nodes ``reassociated`` may rewrite. With
    ``any_precision`` (mode 'always'), paths may also end at an output of any dtype or at a sum; still not at a
    comparison, a min/max reduction or another discontinuous op, whose result a last-bit change can flip (the
    autograd backward recomputes such values and compares them with the forward's)."""
    users = graph.users()
    memo: dict[int, bool] = {}

    def rounded(n) -> bool:
        key = id(n)
        if key in memo:
            return memo[key]
        memo[key] = False  # (a DAG has no cycles; this only guards against malformed graphs)
        if eager_dtype(n) in ROUNDING_DTYPES:  # rounded here, or by eager where float32 intermediates are kept
            ok = True
        else:
            ok = True
            for u in users[key]:
                if u.op == "output":
                    ok = any_precision or (u.stage == Stage.TILE and output_dtypes.get(u.target) in ROUNDING_DTYPES)
                elif any_precision and u.op == "reduce" and u.target == "sum":
                    ok = True
                elif continuous(u):
                    ok = rounded(u)
                else:
                    ok = False
                if not ok:
                    break
        memo[key] = ok
        return ok

    return frozenset(i for i, n in enumerate(graph.nodes) if n.op != "output" and rounded(n))


def _active(mode: str, compute: torch.dtype) -> bool:
    """Whether ``mode`` changes anything for an epilogue computing in ``compute`` (only float32 epilogues are
    approximated or reassociated); an unknown mode is an error."""
    return _on(mode) and compute == torch.float32


def _on(mode: str) -> bool:
    """Whether ``mode`` is one that uses GPU-only emissions at all; an unknown mode is an error."""
    if mode not in MODES:
        raise ValueError(f"unknown fast-math mode {mode!r}")
    return mode != "never"


def select(graph: Graph, output_dtypes: dict, compute: torch.dtype, mode: str) -> frozenset:
    """Indices (in ``graph.nodes``) of the nodes to emit with their fast emission. ``output_dtypes``: output
    position -> the dtype it is stored in."""
    if not _active(mode, compute):
        return frozenset()
    candidates = [i for i, n in enumerate(graph.nodes) if has_emission(n, "triton_fast")]
    if mode == "always" or not candidates:
        return frozenset(candidates)
    exact = {i for i in candidates if REGISTRY[graph.nodes[i].target].fast_exact}
    rounded = rounded_nodes(graph, output_dtypes)
    return frozenset(i for i in candidates if i in exact or i in rounded)


def exact_forms_active(mode: str, compute: torch.dtype) -> bool:
    """Whether a computation in ``compute`` under ``mode`` uses the exact GPU forms (the scans ask this too). Being
    no approximations, they may serve float64 computations too: each op names the computes its form serves
    (``OpDef.gpu_form_serves``)."""
    return _on(mode) and compute in (torch.float32, torch.float64)


def exact_nodes(graph: Graph, compute: torch.dtype, mode: str, fast: frozenset) -> frozenset:
    """Indices of the nodes to emit with their exact GPU form (``OpDef.triton_gpu``): every node of an op that has
    one, outside ``fast``, wherever ``mode`` is active."""
    if not exact_forms_active(mode, compute):
        return frozenset()
    return frozenset(i for i, n in enumerate(graph.nodes)
                     if i not in fast and has_emission(n, "triton_gpu") and REGISTRY[n.target].gpu_form_serves(compute))


@dataclass(frozen=True)
class Emissions:
    """Which nodes (indices in the emitted graph) a program emits with a GPU-only emission: ``fast`` with their op's
    hardware approximation (``OpDef.triton_fast``), ``exact`` with its exact GPU form (``OpDef.triton_gpu``).
    Empty (false) for the portable program, which the interpreter runs."""
    fast: frozenset = frozenset()
    exact: frozenset = frozenset()

    def __bool__(self) -> bool:
        return bool(self.fast or self.exact)

    def of(self, i: int) -> str | None:
        """'fast', 'exact' or None (the op's ``triton`` emission) for node ``i``."""
        return "fast" if i in self.fast else "exact" if i in self.exact else None


def reassociated(graph: Graph, output_dtypes: dict, compute: torch.dtype, mode: str) -> Graph:
    """``graph`` with its float32 polynomial arithmetic reassociated (``passes/reassociate.py``) where ``mode``
    allows approximations: on the rounded nodes in 'auto'; in 'always' also where values reach float32 outputs
    and sums, but never a comparison or a min/max (``rounded_nodes``). A copy when anything changed, else
    ``graph`` itself (so the accurate program keeps its hash)."""
    if not _active(mode, compute):
        return graph
    rounded = rounded_nodes(graph, output_dtypes, any_precision=mode == "always")
    # never a value that reaches a comparison or a min/max, even through a rounding: the autograd backward
    # recomputes it in another graph, whose trees may reassociate differently, and compares the two
    unsafe = reaching_discontinuities(graph)
    picks = [i for i, n in enumerate(graph.nodes) if arithmetic(n) and i in rounded and id(n) not in unsafe]
    if not picks:
        return graph
    copy = graph.copy()
    out = reassociate(copy, {id(copy.nodes[i]) for i in picks})
    return graph if out.structural_hash() == graph.structural_hash() else out


def output_dtypes(ep, out_dtype: torch.dtype) -> dict:
    """Output position -> stored dtype, for full-size outputs of ``out_dtype`` (``Epilogue.output_dtype``)."""
    return {o.position: ep.output_dtype(o, out_dtype) for o in ep.outputs}


def select_for(ep, out_dtype: torch.dtype, mode: str) -> frozenset:
    """``select`` for an ``Epilogue`` whose full-size outputs are stored in ``out_dtype``."""
    if mode == "never":
        return frozenset()
    return select(ep.graph, output_dtypes(ep, out_dtype), ep.acc_dtype, mode)


def plan(ep, out_dtype: torch.dtype, mode: str) -> tuple[Graph, Emissions]:
    """The graph a program is emitted from (``ep.graph``, reassociated where ``mode`` allows) and its nodes to emit
    with GPU-only emissions, for full-size outputs stored in ``out_dtype``."""
    if mode == "never":
        return ep.graph, Emissions()
    dtypes = output_dtypes(ep, out_dtype)
    graph = reassociated(ep.graph, dtypes, ep.acc_dtype, mode) if ep.reassociate else ep.graph
    fast = select(graph, dtypes, ep.acc_dtype, mode)
    return graph, Emissions(fast, exact_nodes(graph, ep.acc_dtype, mode, fast))


def program_hash(ir_hash: str, emissions: Emissions) -> str:
    """The program's identity: the IR hash, extended by the nodes with GPU-only emissions when there are any (so
    the portable program keeps its hash, module file and tuning key)."""
    if not emissions:
        return ir_hash
    text = ",".join(map(str, sorted(emissions.fast)))
    if emissions.exact:
        text += "|" + ",".join(map(str, sorted(emissions.exact)))
    return f"{ir_hash}fm{hashlib.sha256(text.encode()).hexdigest()[:6]}"


def describe(graph: Graph, emissions: Emissions, reassociated: bool = False) -> list[str]:
    """Lines for the generated module's docstring: which nodes use a hardware approximation or an exact GPU form,
    and whether the graph above is the epilogue's reassociated (a function of the program key alone, so equal keys
    give equal sources)."""
    lines = ["fast math: reassociated (the float32 arithmetic rounded to 16 bits, passes/reassociate.py)"
             ] if reassociated else []
    if not emissions:
        return lines + ["fast math: none (accurate tlmath emissions)"]
    if emissions.fast:
        lines.append("fast math: hardware approximation (tlmath.*_approx) at " + node_names(graph, emissions.fast))
    if emissions.exact:
        lines.append("fast math: exact GPU form (tlmath.*_gpu, the accurate values) at "
                     + node_names(graph, emissions.exact))
    return lines


def node_names(graph: Graph, nodes: frozenset) -> str:
    """``%t7 tanh, %t9 sigmoid``: the nodes at these indices, in graph order."""
    return ", ".join(f"%{graph.nodes[i].name} {graph.nodes[i].target}" for i in sorted(nodes))

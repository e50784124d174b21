"""Triton source for the three scan kernels (see ``plan.py`` for when each runs).

All kernels read inputs, inits and write outputs as contiguous time-major tensors ``(T, *row)``; row
shapes are literals of the source (the trace depends on them anyway), the time length ``T`` and the number
of init steps ``K`` are runtime arguments, so one kernel serves every length. Rows ``[0, K)`` of the outputs
are written by the caller (they are init, or ``post`` of init), except the states of the associative kernels,
which copy their init rows themselves (no copy kernel before them).

``scan_lanes`` (sequential, parallel over lane tiles; states in registers)::

    for t in range(K, T):                       # inputs prefetched DEPTH steps ahead
        new = update(h_1 .. h_lag, x rows)      # h_l = state at t - l, in registers
        store(new); store(post(new, x rows)); rotate h

``scan_coupled`` (one program; float32 workspace ring of R = deepest lag + 1 rows; a barrier per step).

The associative (parallel) scans are in ``assoc.py``.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..passes.prune import Prune
from . import emit as E
from .plan import Group, leaves, state_of


@dataclass
class Kernel:
    name: str
    mode: str
    source: str
    args: list            # ("x", i) | ("init", j) | ("out", j) | ("post", p) | ("ws",) | ("sync",) | ("part",)
    ncomp: int = 1        # assoc: components of the scanned element
    ws_width: int = 0     # coupled: workspace lanes per slot
    ws_rows: int = 0      # coupled: workspace slots
    names: tuple = ()     # assoc: the kernels launched in order (one, or three for threepass)
    strategy: str = ""    # assoc: "lookback" | "segmented" | "packed" | "threepass"


def _leaf_key(n):
    return (n.target, n.attrs["lag"], n.attrs["map"], n.attrs["shape"])


def _signature(args, extra) -> str:
    names = []
    for a in args:
        names.append({"x": "x{}", "init": "s{}_init", "out": "s{}_out", "post": "p{}_out"}[a[0]].format(a[1])
                     if len(a) > 1 else a[0])
    return ", ".join(names + extra)


def _io_args(body, g: Group, input_leaves, need_init) -> list:
    xs = sorted({int(n.target[1:]) for n in input_leaves})
    args = [("x", i) for i in xs] + [("init", j) for j in g.states if need_init(j)]
    if body.post is None:
        args += [("out", j) for j in g.states]
    args += [("post", p) for p in g.posts]
    return args


def _doc(body, g: Group, extra: str = "") -> str:
    text = f"{body.name}: {g.describe()}\n\nupdate:\n{g.update}"
    if g.post is not None:
        text += f"\n\npost:\n{g.post}"
    if extra:
        text += f"\n\n{extra}"
    return '"""' + text.replace("\\", "\\\\").replace('"""', "'''") + '\n"""'


# ---------------------------------------------------------------------------------------------- lanes
def render_lanes(body, g: Group, depth: int = 4, exact: bool = False) -> Kernel:
    cd, shape = body.compute_dtype, g.shape
    n_lanes = E.row_size(shape)
    graphs = [gr for gr in (g.update, g.post) if gr is not None]
    inputs = {}
    for gr in graphs:
        for n in leaves(gr):
            if state_of(n) is None:
                inputs.setdefault(_leaf_key(n), n)
    args = _io_args(body, g, inputs.values(), lambda j: g.lags[j] > 0)
    w = E.Writer()
    w("@triton.jit")
    w(f"def scan_lanes({_signature(args, ['T', 'K', 'BLOCK: tl.constexpr'])}):")
    with w.indent():
        w(_doc(body, g))
        w("pid = tl.program_id(0)")
        w("lanes = pid * BLOCK + tl.arange(0, BLOCK)")
        w(f"lmask = lanes < {n_lanes}")
        w("zero = tl.zeros([BLOCK], tl.int32)  # step masks as vectors (also in the interpreter)")
        idx, offsets = set(), {}
        for q, (key, n) in enumerate(inputs.items()):
            src = body.inputs[int(n.target[1:])].shape
            offsets[key] = E.lane_offset(n.attrs["map"], src, n.attrs["shape"], idx)
        E.emit_lane_index(w, idx, shape)
        names = {}
        for q, (key, n) in enumerate(inputs.items()):
            i, lag = int(n.target[1:]), n.attrs["lag"]
            rs = E.row_size(body.inputs[i].shape)
            w(f"o{q} = {offsets[key]}")
            names[key] = q
            for d in range(depth):
                w(f"f{q}_{d} = tl.load(x{i} + tl.cast(K + {d - lag}, tl.int64) * {rs} + o{q}, "
                  f"mask=lmask & (zero + (K + {d}) < T), other=0)")
        for j in g.states:
            h = E.TL[E.held(body.states[j].dtype, cd)]
            for lag in range(1, g.lags[j] + 1):
                w(f"h{j}_{lag} = tl.load(s{j}_init + tl.cast(K - {lag}, tl.int64) * {n_lanes} + lanes, "
                  f"mask=lmask, other=0).to({h})")
        w("for t in range(K, T):")
        with w.indent():
            w("row = tl.cast(t, tl.int64)")
            for key, n in inputs.items():
                q, i, lag = names[key], int(n.target[1:]), n.attrs["lag"]
                rs = E.row_size(body.inputs[i].shape)
                w(f"c{q} = f{q}_0")
                for d in range(depth - 1):
                    w(f"f{q}_{d} = f{q}_{d + 1}")
                w(f"f{q}_{depth - 1} = tl.load(x{i} + (row + {depth - lag}) * {rs} + o{q}, "
                  f"mask=lmask & (zero + (t + {depth}) < T), other=0)")

            def leaf_value(n, new=None):
                j = state_of(n)
                if j is not None:
                    dtype = E.held(body.states[j].dtype, cd)
                    return (f"n{j}", dtype) if n.attrs["lag"] == 0 else (f"h{j}_{n.attrs['lag']}", dtype)
                return (f"c{names[_leaf_key(n)]}", n.dtype)

            def loaded(n):
                expr, dtype = leaf_value(n)
                if state_of(n) is None and dtype.is_floating_point and dtype != cd:
                    return (f"{expr}.to({E.TL[cd]})", cd)
                return (expr, dtype)

            values = E.emit_graph(w, g.update, loaded, cd, "u", exact)
            for out in g.update.outputs:
                j = out.target
                w(f"n{j} = {E.as_held(values[id(out.args[0])], body.states[j].dtype, cd, '[BLOCK]')}")
                if body.post is None:
                    w(f"tl.store(s{j}_out + row * {n_lanes} + lanes, n{j}.to(s{j}_out.dtype.element_ty), "
                      "mask=lmask)")
            if g.post is not None:
                pvals = E.emit_graph(w, g.post, loaded, cd, "v", exact)
                for out in g.post.outputs:
                    p = out.target
                    val = E.as_held(pvals[id(out.args[0])], body.post_specs[p].dtype, cd, "[BLOCK]")
                    w(f"tl.store(p{p}_out + row * {n_lanes} + lanes, ({val}).to(p{p}_out.dtype.element_ty), "
                      "mask=lmask)")
            for j in g.states:
                for lag in range(g.lags[j], 1, -1):
                    w(f"h{j}_{lag} = h{j}_{lag - 1}")
                if g.lags[j] >= 1:
                    w(f"h{j}_1 = n{j}")
    return Kernel("scan_lanes", "lanes", E.HEADER + "\n\n" + w.text(), args)


# ---------------------------------------------------------------------------------------------- coupled
def render_coupled(body, g: Group, exact: bool = False) -> Kernel:
    cd = body.compute_dtype
    R = max([g.lags[j] for j in g.states] + [1]) + 1
    base, W = {}, 0
    for j in g.states:
        base[j] = W
        W += E.row_size(body.states[j].shape)
    inputs = {}
    for gr in (g.update, g.post):
        for n in leaves(gr):
            if state_of(n) is None:
                inputs.setdefault(_leaf_key(n), n)
    args = _io_args(body, g, inputs.values(), lambda j: True) + [("ws",)]
    w = E.Writer()
    w("@triton.jit")
    w(f"def scan_coupled({_signature(args, ['T', 'K', 'BLOCK: tl.constexpr'])}):")
    with w.indent():
        w(_doc(body, g, f"workspace: {R} slots x {W} lanes (float32 ring of the latest steps)"))
        w("ar = tl.arange(0, BLOCK)")
        w("for r in range(0, K):")
        with w.indent():
            for j in g.states:
                nj = E.row_size(body.states[j].shape)
                w(f"for b in range(0, {nj}, BLOCK):")
                with w.indent():
                    w("lanes = b + ar")
                    w(f"v = tl.load(s{j}_init + tl.cast(r, tl.int64) * {nj} + lanes, mask=lanes < {nj}, other=0)")
                    w(f"tl.store(ws + (r % {R}) * {W} + {base[j]} + lanes, v.to({E.TL[cd]}), mask=lanes < {nj})")
        w("tl.debug_barrier()")
        w("for t in range(K, T):")
        with w.indent():
            w("row = tl.cast(t, tl.int64)")
            for j in g.states:
                sub = Prune({j}).run(g.update.copy())
                _coupled_block(w, body, sub, body.states[j].shape, base, W, R, cd,
                               store_ws=f"ws + (t % {R}) * {W} + {base[j]}",
                               store_out=f"s{j}_out" if body.post is None else None,
                               target_dtype=body.states[j].dtype, prefix=f"u{j}_", exact=exact)
            w("tl.debug_barrier()")
            if g.post is not None:
                for out in g.post.outputs:
                    p = out.target
                    sub = Prune({p}).run(g.post.copy())
                    _coupled_block(w, body, sub, body.post_specs[p].shape, base, W, R, cd, store_ws=None,
                                   store_out=f"p{p}_out", target_dtype=body.post_specs[p].dtype, prefix=f"v{p}_",
                                   exact=exact)
    return Kernel("scan_coupled", "coupled", E.HEADER + "\n\n" + w.text(), args, ws_width=W, ws_rows=R)


def _coupled_block(w, body, graph, shape, base, W, R, cd, store_ws, store_out, target_dtype, prefix, exact):
    n = E.row_size(shape)
    w(f"for b in range(0, {n}, BLOCK):")
    with w.indent():
        w("lanes = b + ar")
        w(f"lmask = lanes < {n}")
        idx, lines, vals = set(), [], {}
        for q, leaf in enumerate(leaves(graph)):
            j, lag = state_of(leaf), leaf.attrs["lag"]
            if j is not None:
                src = body.states[j].shape
                off = E.lane_offset(leaf.attrs["map"], src, leaf.attrs["shape"], idx)
                addr = f"ws + ((t - {lag}) % {R}) * {W} + {base[j]} + {off}"
                lines.append(f"l{q} = tl.load({addr}, mask=lmask, other=0, volatile=True)")
                vals[id(leaf)] = (f"l{q}", cd)
            else:
                i = int(leaf.target[1:])
                src = body.inputs[i].shape
                off = E.lane_offset(leaf.attrs["map"], src, leaf.attrs["shape"], idx)
                lines.append(f"l{q} = tl.load(x{i} + (row - {lag}) * {E.row_size(src)} + {off}, mask=lmask, "
                             "other=0)")
                dt = leaf.dtype
                vals[id(leaf)] = (f"l{q}.to({E.TL[cd]})", cd) if dt.is_floating_point and dt != cd else (f"l{q}", dt)
        E.emit_lane_index(w, idx, shape)
        for line in lines:
            w(line)
        values = E.emit_graph(w, graph, lambda leaf: vals[id(leaf)], cd, prefix, exact)
        out = graph.outputs[0]
        w(f"new = {E.as_held(values[id(out.args[0])], target_dtype, cd, '[BLOCK]')}")
        if store_ws is not None:
            w(f"tl.store({store_ws} + lanes, new.to({E.TL[cd]}), mask=lmask)")
        if store_out is not None:
            w(f"tl.store({store_out} + row * {n} + lanes, new.to({store_out}.dtype.element_ty), mask=lmask)")


def render(body, g: Group, exact: bool = False, **options) -> Kernel:
    """The group's kernel(s). ``exact``: ops with an exact GPU form (``OpDef.triton_gpu``: tanh's with bare MUFU
    ops, the same values in fewer instructions) use it; for a GPU's kernels, never the interpreter's."""
    if g.mode == "assoc":
        from .assoc import render_assoc
        hint = options.get("l2hint")
        return render_assoc(body, g, options.get("strategy") or "lookback", True if hint is None else hint,
                            bool(options.get("persist")), bool(options.get("prefetch")),
                            bool(options.get("keep")), exact)
    if g.mode == "lanes":
        return render_lanes(body, g, depth=options.get("depth", 4), exact=exact)
    return render_coupled(body, g, exact)

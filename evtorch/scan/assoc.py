"""Triton source for associative (parallel) scans: ``a * h + b`` and friends, over time, many lanes at once.

A tile is [BLOCK_T steps, BLOCK_N lanes]; one thread owns a few adjacent lanes for all BLOCK_T steps, so the
scan inside a tile runs in registers. The element scanned is ``b`` (sum, prod, max, min, logaddexp) or the
pair ``(a, b)`` of ``h -> a * h + b`` (linear), combined earlier-first by ``combine``. The init row enters as
the first element (``(0, h)`` for linear). The look-back kernels hold a chunk as [SUB_T, NSUB, BLOCK_N]:
NSUB sub-blocks of SUB_T consecutive steps, scanned in registers, then across sub-blocks by a scan of
(exclusive, inclusive) pairs of their totals (``combine_ex``), so a chunk may span warps along time without
the whole tile going through shared memory (NSUB = 1 is the plain tile). Across tiles, four strategies:

``lookback`` (one launch): programs take tickets so chunks start in time order; each publishes its chunk
    aggregate (flag 1), then reads the flags of the previous LB chunks at once and folds aggregates back to
    the nearest published inclusive prefix (flag 2) -- decoupled look-back with a window -- then publishes
    its own inclusive prefix and stores ``carry (+) local scan``. Reads and writes each element once.
    The ``sync`` buffer is never cleared between launches, so a launch needs no memset kernel before it:
    sync[0] counts tickets and the flags start at sync + 1. The caller passes TBASE, the tickets taken so
    far on that buffer (a program's ticket is ``atomic_add(sync, 1) - TBASE``), and EPOCH, which grows by
    one per launch: flags are published as ``EPOCH * 4 + 1`` / ``+ 2``, and a flag below ``EPOCH * 4`` was
    left by an earlier launch and reads as 0 (not yet published). The host knows both numbers because
    launches on one stream run in order (``launch.sync_args``); the device does no bookkeeping at all (a
    last-program reset cost each program a second same-address atomic: H200 run 7, docs/scan.md).
``segmented`` (one launch): a program per SEG-step segment of a lane tile reads the segment once for its
    aggregate, looks back over earlier *segments* with the same flag protocol, then reads the segment again
    (from L2) and scans it from the carry: the per-program round trips are paid once per segment. The
    default for long scans (docs/scan.md, H200 runs 3-4). ``lookback/nocarry`` and ``segmented/nocarry``
    are timing controls without the look-back (wrong results).
``packed`` (one launch, one-component float32 scans): the same look-back with flag and value in one 64-bit
    word per (chunk, lane), so publishing is one store and a look-back step one load, without fences; but
    every poll re-reads LB x BLOCK_N words. Measured slower than ``lookback`` on an H200 (docs/scan.md).
``threepass``: ``scan_reduce`` (aggregate of each SEG-step segment) -> ``scan_carry`` (scan of the segment
    aggregates) -> ``scan_apply`` (re-read, scan, add the carry, store), the last in reverse segment order so
    the segments ``scan_reduce`` read last are still in L2. No inter-program waiting.

Every strategy writes rows [0, K) of the state's output itself (the program of chunk 0 of each lane tile,
``copy_init``), where the caller would otherwise launch a copy kernel for them.
"""
from __future__ import annotations

from . import emit as E
from .plan import Group, leaves, state_of

IDENTITY = {"sum": ("0.0",), "prod": ("1.0",), "max": ('float("-inf")',), "min": ('float("inf")',),
            "logaddexp": ('float("-inf")',), "linear": ("1.0", "0.0")}
TILE = "[BLOCK_T, BLOCK_N]"


def _binary(op: str) -> str:
    from ..ops import REGISTRY
    t = REGISTRY[op].triton
    return t() if callable(t) else t


def combine_source(kind: str) -> str:
    w = E.Writer()
    w("@triton.jit")
    if kind == "linear":
        mul, add = _binary("mul"), _binary("add")
        w("def combine(a0, b0, a1, b1):")
        with w.indent():
            w("# (a0, b0) is earlier in time: h -> a1 * (a0 * h + b0) + b1")
            w(f"return {mul.format('a0', 'a1')}, {add.format(mul.format('a1', 'b0'), 'b1')}")
    else:
        op = {"sum": "add", "prod": "mul", "max": "maximum", "min": "minimum", "logaddexp": "logaddexp"}[kind]
        w("def combine(x0, x1):")
        with w.indent():
            w(f"return {_binary(op).format('x0', 'x1')}")
    w()
    w("@triton.jit")
    if kind == "linear":
        w("def combine_ex(xa0, xb0, qa0, qb0, xa1, xb1, qa1, qb1):")
        with w.indent():
            w("# (exclusive, inclusive) prefixes of consecutive segments, earlier first")
            w("xa, xb = combine(qa0, qb0, xa1, xb1)")
            w("qa, qb = combine(qa0, qb0, qa1, qb1)")
            w("return xa, xb, qa, qb")
    else:
        w("def combine_ex(x0, q0, x1, q1):")
        with w.indent():
            w("# (exclusive, inclusive) prefixes of consecutive segments, earlier first")
            w("return combine(q0, x1), combine(q0, q1)")
    return w.text()


class AssocEmitter:
    def __init__(self, body, g: Group, exact: bool = False):
        self.body, self.g, self.exact = body, g, exact
        self.cd, self.kind = body.compute_dtype, g.assoc.kind
        self.tlc = E.TL[self.cd]
        self.n = E.row_size(g.shape)
        self.nc = g.assoc.ncomp
        self.comps = ["a", "b"] if self.nc == 2 else ["b"]
        self.ident = dict(zip(self.comps, IDENTITY[self.kind]))
        self.j = g.states[0]
        self.inputs = {}
        for gr in (g.assoc.graph, g.post):
            for leaf in leaves(gr):
                if state_of(leaf) is None:
                    key = (leaf.target, leaf.attrs["lag"], leaf.attrs["map"], leaf.attrs["shape"])
                    self.inputs.setdefault(key, leaf)
        self.names = {}
        self.sub = False  # tiles [SUB_T, NSUB, BLOCK_N] (NSUB sub-blocks of SUB_T steps), not [BLOCK_T, BLOCK_N]

    @property
    def tile(self) -> str:
        return "[SUB_T, NSUB, BLOCK_N]" if self.sub else TILE

    @property
    def rix(self) -> str:  # index of a row (time) vector into the tile
        return "[:, :, None]" if self.sub else "[:, None]"

    @property
    def lix(self) -> str:  # index of a lane vector into the tile
        return "[None, None, :]" if self.sub else "[None, :]"

    # ------------------------------------------------------------------ pieces
    def tup(self, prefix, suffix=""):
        return ", ".join(f"{prefix}{c}{suffix}" for c in self.comps)

    def lane_setup(self, w):
        """Lane offsets of every input leaf (depend on lanes only, so computed once per program)."""
        idx, offs = set(), []
        for key, leaf in self.inputs.items():
            i = int(leaf.target[1:])
            offs.append(E.lane_offset(leaf.attrs["map"], self.body.inputs[i].shape, leaf.attrs["shape"], idx))
        E.emit_lane_index(w, idx, self.g.shape)
        for q, off in enumerate(offs):
            w(f"o{q} = {off}")

    def load_tile(self, w, base: str, steps: str = "BLOCK_T", evict: str = ""):
        """Rows ``base ..`` of every input leaf, then the coefficient tiles with identities where masked. With
        sub-blocks, step i of sub-block u is row ``base + u * SUB_T + i`` (tile index [i, u, lane]).
        ``evict``: an L2 eviction priority for the loads ("evict_last", "evict_first"), or none."""
        hint = f", eviction_policy='{evict}'" if evict else ""
        if self.sub:
            w(f"rows = {base} + (tl.arange(0, NSUB)[None, :] * SUB_T + tl.arange(0, SUB_T)[:, None])")
        else:
            w(f"rows = {base} + tl.arange(0, {steps})")
        w(f"mask = (rows < T){self.rix} & lmask{self.lix}")
        w("rows64 = rows.to(tl.int64)")
        for q, (key, leaf) in enumerate(self.inputs.items()):
            i, lag = int(leaf.target[1:]), leaf.attrs["lag"]
            rs = E.row_size(self.body.inputs[i].shape)
            w(f"l{q} = tl.load(x{i} + (rows64 - {lag}){self.rix} * {rs} + o{q}{self.lix}, mask=mask, other=0{hint})")
            self.names[key] = q
        values = E.emit_graph(w, self.g.assoc.graph, self.leaf, self.cd, "c", self.exact)
        for c, name in enumerate(self.comps):
            out = next(o for o in self.g.assoc.graph.outputs if o.target == c)
            val = E.as_held(values[id(out.args[0])], self.cd, self.cd, self.tile)
            w(f"{name} = tl.where(mask, {val}, {self.ident[name]})")

    def leaf(self, leaf):
        if state_of(leaf) is not None:
            return ("y", self.cd)
        key = (leaf.target, leaf.attrs["lag"], leaf.attrs["map"], leaf.attrs["shape"])
        q, dt = self.names[key], leaf.dtype
        return (f"l{q}.to({self.tlc})", self.cd) if dt.is_floating_point and dt != self.cd else (f"l{q}", dt)

    def scan(self, w, src: str, dst: str):
        """``dst*`` = inclusive scan over axis 0 of tiles ``src*``."""
        if self.kind in ("sum", "prod"):  # Triton's own scans (the interpreter runs these vectorized)
            w(f"{dst}b = tl.{'cumsum' if self.kind == 'sum' else 'cumprod'}({src}b, 0)")
        elif self.nc == 2:
            w(f"{self.tup(dst)} = tl.associative_scan(({self.tup(src)}), 0, combine)")
        else:
            w(f"{dst}b = tl.associative_scan({src}b, 0, combine)")

    def reduce(self, w, src: str, dst: str):
        """``dst*`` = the total (axis 0) of tiles ``src*``, masked steps being identities. The commutative kinds
        reduce; the linear pair (not commutative) scans and takes the last row, keeping time order."""
        if self.nc == 2:
            self.scan(w, src, "z")
            self.last_row(w, "z", dst)
        elif self.kind == "sum":
            w(f"{dst}b = tl.sum({src}b, 0)")
        else:
            w(f"{dst}b = tl.reduce({src}b, 0, combine)")

    def last_row(self, w, src: str, dst: str, block: str = "BLOCK_T", rank: int = 2):
        """The last step (axis 0) of tiles ``src*`` (masked steps are identities, so this is the tile's total)."""
        ix = "[:, None, None]" if rank == 3 else "[:, None]"
        for c in self.comps:
            w(f"{dst}{c} = tl.sum(tl.where((tl.arange(0, {block}) == {block} - 1){ix}, {src}{c}, 0.0), 0)")

    def sub_scan(self, w):
        """After ``s*`` = scans inside the sub-blocks: ``x*`` = exclusive prefixes of the sub-blocks [NSUB,
        BLOCK_N] (scan of (exclusive, inclusive) pairs of the sub-block totals) and ``g*`` = the chunk's total."""
        self.last_row(w, "s", "u", block="SUB_T", rank=3)
        for c in self.comps:
            w(f"x{c} = tl.full([NSUB, BLOCK_N], {self.ident[c]}, {self.tlc})")
        w(f"{self.tup('x')}, {self.tup('q')} = tl.associative_scan(({self.tup('x')}, {self.tup('u')}), 0, "
          "combine_ex)")
        self.last_row(w, "q", "g", block="NSUB")

    def finish_sub(self, w):
        """``y*`` = the full scan of the tile from the program's carry ``e*`` and the sub-block prefixes."""
        self.combine(w, "r", "e", "x", first_row=True)
        f = ", ".join(f"r{c}[None, :, :]" for c in self.comps)
        w(f"{self.tup('y')} = combine({f}, {self.tup('s')})")

    def init_element(self, w, dst: str):
        """The init row (step K-1) as a scan element."""
        w(f"{dst}b = tl.load(s{self.j}_init + tl.cast(K - 1, tl.int64) * {self.n} + lanes, mask=lmask, "
          f"other=0).to({self.tlc})")
        if self.nc == 2:
            w(f"{dst}a = tl.zeros([BLOCK_N], {self.tlc})  # h -> 0 * h + h_init")

    def copy_init(self, w):
        """Rows [0, K) of the state's output from its init, stored by the program of chunk 0 of each lane tile
        (no copy kernel on the caller's side). Emitted where chunk 0's inclusive prefix is already out, off the
        look-back's critical path. Nothing for a scan with a post (its states are not written)."""
        if self.body.post is not None:
            return
        j = self.j
        w("if chunk == 0:  # rows [0, K) of the output: the init rows")
        with w.indent():
            w("for r in range(0, K):")
            with w.indent():
                w(f"at = tl.cast(r, tl.int64) * {self.n} + lanes")
                w(f"tl.store(s{j}_out + at, tl.load(s{j}_init + at, mask=lmask, other=0)"
                  f".to(s{j}_out.dtype.element_ty), mask=lmask)")

    def identity_vec(self, w, dst: str):
        for c in self.comps:
            w(f"{dst}{c} = tl.full([BLOCK_N], {self.ident[c]}, {self.tlc})")

    def combine(self, w, dst: str, first: str, second: str, first_row=False):
        f = ", ".join(f"{first}{c}[None, :]" if first_row else f"{first}{c}" for c in self.comps)
        w(f"{self.tup(dst)} = combine({f}, {self.tup(second)})")

    def store(self, w, evict: str = ""):
        """Store state rows ``yb`` (and post outputs of them) for the tile's rows."""
        body, g, n = self.body, self.g, self.n
        hint = f", eviction_policy='{evict}'" if evict else ""
        w("y = yb")
        if body.post is None:
            w(f"tl.store(s{self.j}_out + rows64{self.rix} * {n} + lanes{self.lix}, "
              f"y.to(s{self.j}_out.dtype.element_ty), mask=mask{hint})")
        if g.post is not None:
            pvals = E.emit_graph(w, g.post, self.leaf, self.cd, "v", self.exact)
            for out in g.post.outputs:
                p = out.target
                val = E.as_held(pvals[id(out.args[0])], body.post_specs[p].dtype, self.cd, self.tile)
                w(f"tl.store(p{p}_out + rows64{self.rix} * {n} + lanes{self.lix}, "
                  f"({val}).to(p{p}_out.dtype.element_ty), mask=mask{hint})")

    def part(self, base: str, chunk: str, c: int, which: str = "0", two: bool = True) -> str:
        slots = f"(tl.cast({chunk}, tl.int64) * 2 + {which})" if two else f"tl.cast({chunk}, tl.int64)"
        return f"{base} + ({slots} * {self.nc} + {c}) * {self.n}"

    def doc(self, w, what: str):
        from .kernels import _doc
        w(_doc(self.body, self.g, f"{what}\ncoefficients ({self.kind}):\n{self.g.assoc.graph}"))


# ---------------------------------------------------------------------------------------------- lookback
def _lookback_chunk(em: AssocEmitter, w) -> None:
    """What both look-back kernels do first: take a ticket (chunks start in time order), find their chunk and
    lane tile, load it and scan it locally (partial ``s``)."""
    w(f"ntiles = ({em.n} + BLOCK_N - 1) // BLOCK_N")
    w("ticket = tl.atomic_add(sync, 1) - TBASE  # chunks start in time order: look-back only waits on started ones")
    w("chunk = ticket // ntiles")
    w("tile = ticket - chunk * ntiles")
    w("lanes = tile * BLOCK_N + tl.arange(0, BLOCK_N)")
    w(f"lmask = lanes < {em.n}")
    em.lane_setup(w)
    w("SUB_T: tl.constexpr = BLOCK_T // NSUB  # steps per sub-block (one warp's rows where the layout allows)")
    em.sub = True
    em.load_tile(w, "K + chunk * BLOCK_T")
    em.scan(w, "", "s")
    em.sub_scan(w)


def _carry_in(em: AssocEmitter, w, carry: bool = True) -> None:
    """From the chunk's aggregate ``g*``: ``e*`` = everything before the chunk (the init row folded in), by
    decoupled look-back over the flags of chunks ``chunk - 1, chunk - 2, ..`` of this lane tile, LB at a time;
    publishes the aggregate (flag 1) first and the inclusive prefix ``e (+) g`` (flag 2) last, as this
    launch's ``EPOCH * 4 + flag`` (module docstring). Then chunk 0 copies the init rows. ``carry=False`` is a
    timing control: no flags, no waiting, ``e`` = identity (wrong results past the first chunk)."""
    if carry:
        w("flags = sync + 1")
    w("if chunk == 0:")
    with w.indent():
        em.init_element(w, "e")
    w("else:")
    with w.indent():
        if not carry:
            em.identity_vec(w, "e")
        else:
            for c, name in enumerate(em.comps):
                w(f"tl.store({em.part('part', 'chunk', c)} + lanes, g{name}, mask=lmask)")
            w("tl.debug_barrier()")
            w("tl.atomic_xchg(flags + chunk * ntiles + tile, EPOCH * 4 + 1, sem='release')  # aggregate published")
            em.identity_vec(w, "e")
            w("win = tl.arange(0, LB)  # window position p reads chunk j - (LB - 1) + p: ascending in time")
            w("j = chunk - 1")
            w("while j >= 0:")
            with w.indent():
                w("idx = j - (LB - 1) + win")
                w("f = tl.atomic_add(flags + idx * ntiles + tile, 0, mask=idx >= 0, sem='acquire')")
                w("f = tl.where(idx >= 0, tl.maximum(f - EPOCH * 4, 0), 0)  # an earlier launch's flag reads as 0")
                w("p2 = tl.max(tl.where(f == 2, win, -1), 0)  # nearest inclusive prefix")
                w("p0 = tl.max(tl.where(f == 0, win, -1), 0)  # nearest chunk not yet published")
                w("lo = tl.where(p2 > p0, p2, p0 + 1)  # fold positions lo .. LB-1")
                w("take = (win >= lo)[:, None] & lmask[None, :]")
                w("slot = tl.where(f == 2, 1, 0)[:, None]")
                for c, name in enumerate(em.comps):
                    addr = (f"part + ((idx.to(tl.int64)[:, None] * 2 + slot) * {em.nc} + {c}) * {em.n} + "
                            "lanes[None, :]")
                    w(f"v{name} = tl.where(take, tl.load({addr}, mask=take, other=0, volatile=True), "
                      f"{em.ident[name]})")
                em.scan(w, "v", "w")
                em.last_row(w, "w", "t", block="LB")
                em.combine(w, "e", "t", "e")
                w("j = tl.where(p2 > p0, -1, j - (LB - 1) + p0)")
    if carry:
        em.combine(w, "i", "e", "g")
        for c, name in enumerate(em.comps):
            w(f"tl.store({em.part('part', 'chunk', c, '1')} + lanes, i{name}, mask=lmask)")
        w("tl.debug_barrier()")
        w("tl.atomic_xchg(flags + chunk * ntiles + tile, EPOCH * 4 + 2, sem='release')  # inclusive prefix published")
    em.copy_init(w)


def _def_one_pass(w, sig: str, last: str) -> None:
    """The header of the one-launch kernels (lookback, packed: NSUB; segmented: SEG): TBASE and EPOCH are the
    sync protocol's ticket base and epoch (module docstring)."""
    w("@triton.jit")
    w(f"def scan_assoc({sig}, T, K, TBASE, EPOCH, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, LB: tl.constexpr, "
      f"{last}: tl.constexpr):")


def render_lookback(em: AssocEmitter, sig: str, carry: bool = True) -> str:
    w = E.Writer()
    _def_one_pass(w, sig, "NSUB")
    with w.indent():
        em.doc(w, "one-pass scan with decoupled look-back over LB chunks at a time"
               + ("" if carry else "\nTIMING CONTROL: no look-back, wrong results"))
        _lookback_chunk(em, w)
        _carry_in(em, w, carry)
        em.finish_sub(w)
        em.store(w)
    return w.text()


# ---------------------------------------------------------------------------------------------- segmented
def _stash(em: AssocEmitter, w, name: str, restore: bool = False) -> None:
    """Copy a loaded tile to ``{name}_*`` names, or back (``restore``), so it is held in registers across other
    code: its rows and the coefficient tiles (masked steps already identities), and the raw input loads only
    where a post reads them; the tile mask is recomputed from the rows on restore (not held)."""
    names = ["rows"] + ([f"l{q}" for q in range(len(em.inputs))] if em.g.post is not None else []) + list(em.comps)
    for v in names:
        w(f"{v} = {name}_{v}" if restore else f"{name}_{v} = {v}")
    if restore:
        w(f"mask = (rows < T){em.rix} & lmask{em.lix}")
        w("rows64 = rows.to(tl.int64)")


def render_segmented(em: AssocEmitter, sig: str, carry: bool = True, l2hint: bool = True,
                     persist: bool = False, prefetch: bool = False, keep: bool = False) -> str:
    """One launch, one program per SEG-step segment of a lane tile (SEG / BLOCK_T tiles): the segment is read
    once for its aggregate (a reduction per tile), the carry comes from the decoupled look-back over earlier
    *segments* (the flag protocol of ``lookback``, with segments for chunks), then the segment is read again,
    scanned tile by tile from the carry and stored. The second read is meant to hit L2 (resident programs x
    segment bytes well under the L2), so DRAM sees each element read and written once, and the per-program
    round trips (ticket, publish, poll) are paid once per segment instead of once per tile. ``l2hint``: the
    first read asks L2 to keep the lines (evict_last), the second read and the stores to drop them first.
    ``persist``: a fixed grid of programs, each taking segment after segment (its next ticket as soon as its
    inclusive prefix is out, before the second read), so the grid bounds the bytes waiting in L2.
    ``keep``: the segment's last tile stays in registers from the first read (read once, not re-read).
    ``prefetch``: the second read's first tile is loaded before the look-back (held in registers), so its
    L2 latency overlaps the polling. With both, the segment needs at least two tiles (the caller checks)."""
    first, again = ("evict_last", "evict_first") if l2hint else ("", "")
    w = E.Writer()
    _def_one_pass(w, sig, "SEG")
    with w.indent():
        em.doc(w, "one-pass scan over segments of SEG steps: reduce, look back over segments, re-read and scan"
               + (" (persistent programs)" if persist else "")
               + (" (last tile kept in registers)" if keep else "")
               + (" (first re-read tile loaded before the look-back)" if prefetch else "")
               + ("" if carry else "\nTIMING CONTROL: no look-back, wrong results"))
        w(f"ntiles = ({em.n} + BLOCK_N - 1) // BLOCK_N")
        w("ticket = tl.atomic_add(sync, 1) - TBASE  # segments start in time order: look-back only waits on started ones")
        if persist:
            w("total = ntiles * ((T - K + SEG - 1) // SEG)")
            w("while ticket < total:")
            w.depth += 1
        w("chunk = ticket // ntiles  # the segment")
        w("tile = ticket - chunk * ntiles")
        w("lanes = tile * BLOCK_N + tl.arange(0, BLOCK_N)")
        w(f"lmask = lanes < {em.n}")
        em.lane_setup(w)
        em.sub = False
        em.identity_vec(w, "g")
        end1 = "SEG - BLOCK_T" if keep else "SEG"
        w(f"for r0 in range(0, {end1}, BLOCK_T):  # read 1: the segment's aggregate")
        with w.indent():
            em.load_tile(w, "K + chunk * SEG + r0", evict=first)
            em.reduce(w, "", "u")
            em.combine(w, "g", "g", "u")
        if keep:
            w("# the last tile: read once, held in registers until the scan")
            em.load_tile(w, "K + chunk * SEG + SEG - BLOCK_T", evict=again)
            em.reduce(w, "", "u")
            em.combine(w, "g", "g", "u")
            _stash(em, w, "kt")
        if prefetch:
            w("# the second read's first tile, issued before the look-back (held in registers)")
            em.load_tile(w, "K + chunk * SEG", evict=again)
            _stash(em, w, "pt")
        _carry_in(em, w, carry)
        if persist:
            w("ticket = tl.atomic_add(sync, 1) - TBASE  # the next segment (this one no longer holds anyone up)")

        def scan_store():
            em.scan(w, "", "s")
            em.combine(w, "y", "e", "s", first_row=True)
            em.last_row(w, "y", "e")
            em.store(w, evict=again)
        if prefetch:
            _stash(em, w, "pt", restore=True)
            scan_store()
        start2 = "BLOCK_T" if prefetch else "0"
        w(f"for r0 in range({start2}, {end1}, BLOCK_T):  # read 2 (from L2): scan from the carry, store")
        with w.indent():
            em.load_tile(w, "K + chunk * SEG + r0", evict=again)
            scan_store()
        if keep:
            _stash(em, w, "kt", restore=True)
            scan_store()
        if persist:
            w.depth -= 1
    return w.text()


# ---------------------------------------------------------------------------------------------- packed
def packed_ok(body, g: Group) -> bool:
    """The packed look-back needs a one-component element held in float32 (value and flag share 64 bits)."""
    import torch
    return g.assoc.ncomp == 1 and body.compute_dtype == torch.float32


def render_packed(em: AssocEmitter, sig: str) -> str:
    """Decoupled look-back with one 64-bit word per (chunk, lane): flag (high half: 0 nothing, 1 aggregate,
    2 inclusive prefix) and the float32 value (low half), written by one store and read by one load, so a
    reader that sees a flag also sees its value: no barrier or fence on either side, and a look-back step is
    a single (volatile) load of the window. ``part`` is int64, zeroed by the caller. Lanes finish
    independently; the window position is common to the program (the latest chunk that some lane still
    waits for). Opt-in: measured 1.2-4x slower than ``lookback`` on an H200 (docs/scan.md, run 2)."""
    assert em.nc == 1
    w = E.Writer()
    w("@triton.jit")
    w("def pack(flag, v):")
    with w.indent():
        w("return (flag.to(tl.int64) << 32) | (v.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF)")
    w()
    _def_one_pass(w, sig, "NSUB")
    with w.indent():
        em.doc(w, "one-pass scan, decoupled look-back over LB chunks at a time, flag and value in one word")
        _lookback_chunk(em, w)
        w(f"word = part + tl.cast(chunk, tl.int64) * {em.n} + lanes")
        w("if chunk == 0:")
        with w.indent():
            em.init_element(w, "e")
        w("else:")
        with w.indent():
            w("tl.store(word, pack(tl.full([BLOCK_N], 1, tl.int32), gb), mask=lmask)  # aggregate published")
            em.identity_vec(w, "e")
            w("win = tl.arange(0, LB)  # window position p reads chunk j - (LB - 1) + p: ascending in time")
            w("live = lmask")
            w("j = chunk - 1")
            w("while j >= 0:")
            with w.indent():
                w("idx = j - (LB - 1) + win")
                w("ok = (idx >= 0)[:, None] & live[None, :]")
                w(f"wd = tl.load(part + idx.to(tl.int64)[:, None] * {em.n} + lanes[None, :], mask=ok, other=0, "
                  "volatile=True)")
                w("f = (wd >> 32).to(tl.int32)")
                w("p2 = tl.max(tl.where(f == 2, win[:, None], -1), 0)  # per lane: nearest inclusive prefix")
                w("p0 = tl.max(tl.max(tl.where((f == 0) & ok, win[:, None], -1), 1), 0)  # nearest unpublished, "
                  "any live lane")
                w("lo = tl.maximum(p2, p0 + 1)  # per lane: fold positions lo .. LB-1")
                w("take = (win[:, None] >= lo[None, :]) & ok")
                w(f"vb = tl.where(take, wd.to(tl.int32).to(tl.float32, bitcast=True), {em.ident['b']})")
                em.scan(w, "v", "w")
                em.last_row(w, "w", "t", block="LB")
                em.combine(w, "e", "t", "e")
                w("live = live & (p2 <= p0)  # lanes that found their inclusive prefix are done")
                w("j = tl.where(tl.max(live.to(tl.int32), 0) > 0, j - (LB - 1) + p0, -1)")
            w("tl.debug_barrier()")
        em.combine(w, "i", "e", "g")
        w("tl.store(word, pack(tl.full([BLOCK_N], 2, tl.int32), ib), mask=lmask)  # inclusive prefix published")
        em.copy_init(w)
        em.finish_sub(w)
        em.store(w)
    return w.text()


# ---------------------------------------------------------------------------------------------- three passes
def render_threepass(em: AssocEmitter, sig: str) -> str:
    consts = "BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, SEG: tl.constexpr"
    w = E.Writer()
    w("@triton.jit")
    w(f"def scan_reduce({sig}, T, K, {consts}):")
    with w.indent():
        em.doc(w, "pass 1 of 3: the aggregate of each SEG-step segment of each lane tile")
        w(f"ntiles = ({em.n} + BLOCK_N - 1) // BLOCK_N")
        w("pid = tl.program_id(0)")
        w("chunk = pid // ntiles")
        w("tile = pid - chunk * ntiles")
        w("lanes = tile * BLOCK_N + tl.arange(0, BLOCK_N)")
        w(f"lmask = lanes < {em.n}")
        em.lane_setup(w)
        em.identity_vec(w, "e")
        w("for r0 in range(0, SEG, BLOCK_T):")
        with w.indent():
            em.load_tile(w, "K + chunk * SEG + r0")
            em.scan(w, "", "s")
            em.last_row(w, "s", "g")
            em.combine(w, "e", "e", "g")
        for c, name in enumerate(em.comps):
            w(f"tl.store({em.part('part', 'chunk', c, two=False)} + lanes, e{name}, mask=lmask)")
    w()
    w("@triton.jit")
    w(f"def scan_carry({sig}, T, K, {consts}):")
    with w.indent():
        w('"""pass 2 of 3: inclusive prefixes of the segment aggregates, init row first (in place)."""')
        w("lanes = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)")
        w(f"lmask = lanes < {em.n}")
        w("nseg = (T - K + SEG - 1) // SEG")
        em.init_element(w, "e")
        w("for c0 in range(0, nseg, BLOCK_T):")
        with w.indent():
            w("cs = c0 + tl.arange(0, BLOCK_T)")
            w("m = (cs < nseg)[:, None] & lmask[None, :]")
            for c, name in enumerate(em.comps):
                addr = f"part + (cs.to(tl.int64)[:, None] * {em.nc} + {c}) * {em.n} + lanes[None, :]"
                w(f"{name} = tl.where(m, tl.load({addr}, mask=m, other=0), {em.ident[name]})")
            em.scan(w, "", "s")
            em.combine(w, "y", "e", "s", first_row=True)
            for c, name in enumerate(em.comps):
                addr = f"part + (cs.to(tl.int64)[:, None] * {em.nc} + {c}) * {em.n} + lanes[None, :]"
                w(f"tl.store({addr}, y{name}, mask=m)")
            em.last_row(w, "y", "e")
    w()
    w("@triton.jit")
    w(f"def scan_apply({sig}, T, K, {consts}):")
    with w.indent():
        w('"""pass 3 of 3: each segment again, from its carry; latest segments first (still in L2)."""')
        w(f"ntiles = ({em.n} + BLOCK_N - 1) // BLOCK_N")
        w("nseg = (T - K + SEG - 1) // SEG")
        w("pid = tl.program_id(0)")
        w("chunk = nseg - 1 - pid // ntiles")
        w("tile = pid % ntiles")
        w("lanes = tile * BLOCK_N + tl.arange(0, BLOCK_N)")
        w(f"lmask = lanes < {em.n}")
        em.lane_setup(w)
        w("if chunk == 0:")
        with w.indent():
            em.init_element(w, "e")
        w("else:")
        with w.indent():
            for c, name in enumerate(em.comps):
                w(f"e{name} = tl.load({em.part('part', 'chunk - 1', c, two=False)} + lanes, mask=lmask, other=0)")
        w("for r0 in range(0, SEG, BLOCK_T):")
        with w.indent():
            em.load_tile(w, "K + chunk * SEG + r0")
            em.scan(w, "", "s")
            em.combine(w, "y", "e", "s", first_row=True)
            em.last_row(w, "y", "e")
            em.store(w)
        em.copy_init(w)
    return w.text()


STRATEGIES = ("lookback", "segmented", "packed", "threepass")


def render_assoc(body, g: Group, strategy: str = "lookback", l2hint: bool = True, persist: bool = False,
                 prefetch: bool = False, keep: bool = False, exact: bool = False):
    """Kernels for one associative group. ``strategy`` is one of STRATEGIES; "lookback/nocarry" and
    "segmented/nocarry" are timing controls (the same kernel without the look-back: wrong results)."""
    from .kernels import Kernel, _io_args, _signature
    base, _, control = strategy.partition("/")
    if base not in STRATEGIES or control not in ("", "nocarry") or (control and base not in ("lookback",
                                                                                              "segmented")):
        raise ValueError(f"unknown associative scan strategy {strategy!r}; expected one of {STRATEGIES}")
    carry = not control
    em = AssocEmitter(body, g, exact)
    args = _io_args(body, g, em.inputs.values(), lambda s: True) + [("sync",), ("part",)]
    sig = _signature(args, [])
    src = combine_source(em.kind) + "\n\n"
    if base == "lookback":
        src += render_lookback(em, sig, carry)
        names = ("scan_assoc",)
    elif base == "segmented":
        src += render_segmented(em, sig, carry, l2hint, persist, prefetch, keep)
        names = ("scan_assoc",)
    elif base == "packed":
        src += render_packed(em, sig)
        names = ("scan_assoc",)
    else:
        src += render_threepass(em, sig)
        names = ("scan_reduce", "scan_carry", "scan_apply")
    return Kernel(names[0], "assoc", E.HEADER + "\n\n" + src, args, ncomp=em.nc, names=names, strategy=base)

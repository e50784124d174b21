"""Running a traced scan: generated kernels (per group) or the reference executor.

Kernels are rendered once per (body signature, group, options), written to the kernel cache as real files
(``runtime.source_cache.load_module``: Triton reads kernel source with ``inspect``) and launched with a
``ScanConfig``: the heuristics below, or one given explicitly (the benchmark sweeps a few).

A scan of associative groups is one kernel launch per group and nothing else: those kernels write the init
rows of their outputs themselves, and the look-back kernels (``lookback``, ``segmented``) need no zeroed
``sync`` buffer (a ticket base and an epoch that outdates old flags: ``assoc.py``), so it is allocated once
per (device, stream) and reused (``sync_args``) instead of being zeroed by a memset kernel before each launch.
The two small kernels and their launch gaps cost ~9 us on top of the ~92 us kernel of a (4096, 8192) float32
cumsum on an H200 (docs/scan.md).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from ..codegen.fastmath import exact_forms_active
from ..runtime import knobs
from ..runtime.gemm import fast_math_mode
from ..runtime.pools import keepable
from ..ops import REGISTRY
from ..runtime.source_cache import load_module
from . import kernels as K
from .errors import ScanError
from .assoc import STRATEGIES, packed_ok
from .plan import leaves, state_of
from .reference import held_dtype, run_post, run_reference


@dataclass(frozen=True)
class ScanConfig:
    """Launch parameters; None picks the heuristic.

    ``block_n``: lanes per program (all modes); ``block_t``: steps per tile (assoc); ``depth``: steps of input
    prefetch (lanes); ``strategy``: "lookback", "segmented", "packed" or "threepass" (assoc; "segmented"
    gives each program ``seg`` steps of a lane tile, read twice (the second time from L2) around one
    look-back over segments; "packed" is the look-back with flag and value in one 64-bit word per lane, for
    one-component float32 scans, else "lookback"; "lookback/nocarry" and "segmented/nocarry" are timing
    controls without the look-back, whose results are wrong); ``window``: chunks (segments) inspected per
    look-back step; ``seg``: steps per segment (threepass, segmented; a multiple of block_t); ``sub``:
    sub-blocks per chunk (lookback, packed; a power of two dividing block_t): the chunk is scanned as ``sub``
    blocks of block_t / sub consecutive steps in registers, then across the sub-blocks, so a chunk may span
    warps along time with only the sub-block totals crossing warps; ``l2hint`` (segmented): L2 eviction
    hints (keep the first read, drop the second read and the stores first); ``persist`` (segmented): a
    persistent grid of this many programs per multiprocessor, each taking segment after segment (None or 0:
    one program per segment); ``maxnreg`` (lookback, segmented, packed): a cap on registers per thread passed
    to Triton, so that more programs fit on a multiprocessor; ``keep`` (segmented): the segment's last tile stays in
    registers from the first read instead of being read again; ``prefetch`` (segmented): the second read's
    first tile is loaded before the look-back, so its latency overlaps the polling (dropped where the segment
    has one tile and ``keep`` holds it already). The defaults are the best
    measured on an H200 (docs/scan.md); "packed" and sub > 1 measured slower there.
    """

    block_t: int | None = None
    block_n: int | None = None
    num_warps: int | None = None
    depth: int = 4
    strategy: str | None = None
    window: int | None = None
    seg: int | None = None
    sub: int | None = None
    l2hint: bool | None = None
    persist: int | None = None
    maxnreg: int | None = None
    keep: bool | None = None
    prefetch: bool | None = None

    def __post_init__(self):
        """Fields a kernel cannot take are named here: a non-power-of-two tile failed inside Triton (``arange's
        range must be a power of 2``) after a look-back program had taken its ticket, and ``depth=0`` generated a
        kernel that did not parse (found 2026-11-29); an unknown ``strategy`` met a raw ValueError in the kernel
        renderer, an AttributeError for a non-string, or nothing at all on a lane-wise body (found by a probe the
        same day)."""
        known = STRATEGIES + ("lookback/nocarry", "segmented/nocarry")
        if self.strategy is not None and self.strategy not in known:
            raise ScanError(f"ScanConfig.strategy={self.strategy!r}: expected one of {', '.join(map(repr, known))} "
                            "or None (the nocarry ones are timing controls whose results are wrong)")
        for name in ("block_t", "block_n", "num_warps", "window", "sub"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1 or v & (v - 1)):
                raise ScanError(f"ScanConfig.{name}={v!r}: expected a power of two (1, 2, 4, ...) or None")
        for name, low in (("depth", 1), ("seg", 1), ("persist", 0), ("maxnreg", 1)):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < low):
                raise ScanError(f"ScanConfig.{name}={v!r}: expected an integer >= {low}"
                                + ("" if name == "depth" else " or None"))


def _np2(x: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, x))))


def _sm_count(device) -> int:
    if device.type != "cuda":
        return 8
    try:
        return torch.cuda.get_device_properties(device).multi_processor_count
    except (AssertionError, RuntimeError):  # no CUDA in this process (offline compile checks)
        return 132


INT32_MAX = 2 ** 31 - 1
_SYNC: dict = {}  # (device, stream id) -> [buffer, tickets taken so far, epoch of the last launch]


def sync_args(device, size: int, tickets: int):
    """``(buffer, TBASE, EPOCH, done)`` for a look-back launch that takes ``tickets`` tickets and uses ``size``
    entries of ``sync`` (assoc.py's protocol); call ``done()`` once the launch is queued. Cached per (device,
    stream): launches on one stream run in order, so the host knows how many tickets earlier launches took
    and which epoch their flags carry. A buffer too small, or whose ticket count or epoch would pass int32,
    is replaced by a fresh ``torch.zeros`` (the next power of two; dropping the old one is stream-safe: the
    caching allocator reuses it only for work queued after it on that stream). A launch that raises drops the
    buffer (``drop_sync``): on a GPU Triton raises before queuing, but the interpreter runs programs, each taking
    a ticket, until one raises. While a CUDA graph is captured, a fresh
    zeroed buffer per call with TBASE 0 and EPOCH 1: the captured memset resets it at every replay (the host
    cannot count replays), and no cached buffer's address is baked into a graph, where freeing it on a later
    replacement would leave the graph writing to freed memory. Likewise, uncached, a buffer that came from a
    CUDA graph's pool (torch.compile's CUDA-graph trees warming a graph up: ``runtime.pools``)."""
    cuda = device.type == "cuda"
    if cuda and torch.cuda.is_current_stream_capturing():
        return torch.zeros(size, dtype=torch.int32, device=device), 0, 1, lambda: None
    key = (device, torch.cuda.current_stream(device).stream_id if cuda else None)
    hit = _SYNC.get(key)
    if hit is None or hit[0].numel() < size or hit[1] + tickets > INT32_MAX or (hit[2] + 1) * 4 + 2 > INT32_MAX:
        fresh = torch.zeros(_np2(size), dtype=torch.int32, device=device)
        if not keepable(fresh):  # a CUDA-graph trees warm-up (runtime.pools): used once, like a capture's
            return fresh, 0, 1, lambda: None
        hit = _SYNC[key] = [fresh, 0, 0]
    base, epoch = hit[1], hit[2] + 1

    def done():
        hit[1], hit[2] = base + tickets, epoch
    return hit[0], base, epoch, done


def gpu_forms(x: torch.Tensor, compute: torch.dtype) -> bool:
    """Whether a scan on ``x``'s device uses the ops' exact GPU forms (``OpDef.triton_gpu``): as the GEMM epilogues
    do (``codegen/fastmath.py``), on an NVIDIA GPU of compute capability >= 7.5 for float32 computations (float64 ones
    for the ops whose form serves them: ``OpDef.gpu_form_serves``), unless
    ``EVTORCH_FAST_MATH=never``. The hardware approximations (``triton_fast``) are never used in a scan: a state
    carries an approximation's error into every later step."""
    return exact_forms_active(fast_math_mode(x), compute)


def drop_sync(device) -> None:
    """Forget the cached sync buffer of ``device``'s current stream (``sync_args``)."""
    cuda = device.type == "cuda"
    _SYNC.pop((device, torch.cuda.current_stream(device).stream_id if cuda else None), None)


def kernel_for(body, g, config: ScanConfig, exact: bool = False):
    """(Kernel, [jit functions in launch order]) for this group and options (rendered and imported once).
    ``exact``: with the ops' exact GPU forms (``gpu_forms``)."""
    seg = (config.strategy or "").startswith("segmented")
    hint, persist = (config.l2hint, bool(config.persist)) if seg else (None, False)
    keep, pre = (bool(config.keep), bool(config.prefetch)) if seg else (False, False)
    key = ("kernel", g.mode, config.depth, config.strategy, hint, persist, keep, pre, exact)
    cache = g.__dict__.setdefault("_kernels", {})
    hit = cache.get(key)
    if hit is None:
        kern = K.render(body, g, exact, depth=config.depth, strategy=config.strategy, l2hint=hint, persist=persist,
                        keep=keep, prefetch=pre)
        module = load_module(kern.source, f"scan_{kern.mode}_{body.name}")
        for gr in (g.update, g.post):  # user-registered @triton.jit ops the group's kernels call by name
            for n in gr.nodes if gr is not None else ():
                if n.op == "compute" and REGISTRY[n.target].user_defined is not None:
                    setattr(module, n.target, REGISTRY[n.target].user_defined)
        hit = cache[key] = (kern, [getattr(module, name) for name in (kern.names or (kern.name,))])
    return hit


def _assoc_config(body, g, steps: int, interp: bool) -> ScanConfig:
    """Heuristic tiles for the parallel scan. GPU choices are the best configs of the H200 sweeps in
    docs/scan.md (2026-11-21, runs 1-4). float32: 16 steps x 512 lanes per tile (one thread owns 4 adjacent
    lanes for all 16 steps, so the in-tile scan is register-only); 16-bit data: 1024 lanes (8 per thread, the
    same 16-byte accesses, and no shared-memory layout change, which a 16 x 512 bf16 tile needs). Long scans
    (>= 16384 steps) use the segmented strategy (32-step segments read twice around one look-back over
    segments), shorter ones the flag look-back over single chunks. float64 keeps the run-1 look-back (not
    measured segmented). Measured slower and so never chosen here: chunks of 32-128 steps over 64-256 lanes
    (sub-blocks), the packed look-back, 8 warps per program, longer segments or persistent grids or register
    caps for float32 sums, 8-step tiles for sums."""
    n = math.prod(g.shape)
    if interp:
        bt = min(_np2(steps), 32)
        return ScanConfig(bt, min(_np2(n), 32), 1, strategy="lookback", window=4, seg=2 * bt, sub=1, l2hint=True)
    bn = min(_np2(n), 512)
    nw = max(1, min(4, bn // 128))
    narrow = min([body.inputs[int(leaf.target[1:])].dtype.itemsize for leaf in leaves(g.assoc.graph)
                  if state_of(leaf) is None] + [body.states[g.states[0]].dtype.itemsize]) < 4
    bn16 = min(_np2(n), 1024)  # 16-bit data: 8 lanes per thread
    nw16 = max(1, min(4, bn16 // 256))
    long = steps >= 1024 * 16
    if body.compute_dtype == torch.float64:  # run 1's look-back
        if g.assoc.ncomp == 2:
            return ScanConfig(8, bn, nw, strategy="threepass", window=1, seg=256, sub=1) if long else \
                ScanConfig(16, bn, nw, strategy="lookback", window=8, seg=256, sub=1)
        return ScanConfig(16, bn, nw, strategy="lookback", window=16 if long else 1, seg=256, sub=1)
    if g.assoc.ncomp == 2:  # a * h + b, (65536, 1024): fp32 1.72x floor (threepass 1.93x), bf16 2.45x (4.67x)
        if long and narrow:
            return ScanConfig(8, bn16, nw16, strategy="segmented", window=8, seg=32, sub=1)
        if long:  # run 6: the segment's last tile kept in registers, 1.55x (1.72x without)
            return ScanConfig(16, bn, nw, strategy="segmented", window=8, seg=32, sub=1, keep=True)
        if narrow:
            return ScanConfig(8, bn, nw, strategy="threepass", window=1, seg=256, sub=1)
        return ScanConfig(16, bn, nw, strategy="lookback", window=8, seg=256, sub=1)  # (4096, 8192): 1.68x
    if g.assoc.kind == "logaddexp":  # (65536, 1024): segmented 64-step segments 5.7x floor, lookback 12.4x
        return ScanConfig(8, bn, nw, strategy="segmented" if long else "lookback", window=8, seg=64, sub=1)
    if narrow:  # bf16 (65536, 1024): 1.98x floor (16 x 512 lookback 3.42x); (4096, 8192): 2.42x (2.77x)
        return ScanConfig(16, bn16, nw16, strategy="segmented" if long else "lookback", window=8 if long else 1,
                          seg=32, sub=1)
    if long:  # (65536, 1024), run 6: 8-step tiles, last tile kept, first re-read tile prefetched before the
        # look-back: 1.36x floor (16-step tiles without them 1.51-1.56x; lookback 1.62-1.73x)
        return ScanConfig(8, bn, nw, strategy="segmented", window=8, seg=32, sub=1, keep=True, prefetch=True)
    return ScanConfig(16, bn, nw, strategy="lookback", window=1, seg=256, sub=1)  # (4096, 8192): 1.47x


def check_deterministic_strategy(config: ScanConfig | None, deterministic: bool) -> None:
    """Refuse a ``config.strategy`` that looks back in a deterministic scan, whatever the backend and body (the
    reference backend and lane-wise bodies never run it, but the same call must not run there and fail on a GPU's
    associative kernels; found by a probe, 2026-11-29)."""
    if deterministic and config is not None and config.strategy not in (None, "threepass"):
        raise ScanError(f"evt.scan: config.strategy={config.strategy!r} combines chunks in the order their totals "
                        "are published, which changes float roundings between runs, and the scan is deterministic "
                        "(deterministic=True or torch.use_deterministic_algorithms): use strategy='threepass' or "
                        "None")


def heuristic(body, g, T: int, device, config: ScanConfig, deterministic: bool = False) -> ScanConfig:
    """The launch configuration of group ``g``: ``config``'s fields where set, the measured heuristics' elsewhere.
    ``deterministic``: an associative group takes the three-pass strategy, whose combination order is fixed (the
    look-back strategies fold whichever earlier totals are published when a program looks, so their float
    roundings change from run to run)."""
    interp = device.type != "cuda"
    if g.mode == "assoc":
        steps = max(1, T - body.k)
        h = _assoc_config(body, g, steps, interp)
        if deterministic:
            check_deterministic_strategy(config, deterministic)
            if h.strategy != "threepass":
                h = replace(h, strategy="threepass", window=1, seg=256, keep=False, prefetch=False, persist=None)
        bt = config.block_t or h.block_t
        bt = min(bt, max(2, _np2(steps))) if not config.block_t else bt
        seg = config.seg or h.seg
        seg = max(bt, seg // bt * bt)
        strategy = config.strategy or h.strategy
        if strategy == "packed" and not packed_ok(body, g):  # two components or float64: flags and values apart
            strategy = "lookback"
        sub = min(config.sub or h.sub, bt)
        if sub & (sub - 1) or bt % sub:
            raise ValueError(f"ScanConfig.sub={sub} must be a power of two dividing block_t={bt}")
        l2hint = h.l2hint if config.l2hint is None else config.l2hint
        keep = bool(h.keep if config.keep is None else config.keep)
        pre = bool(h.prefetch if config.prefetch is None else config.prefetch)
        if keep and pre and seg == bt:  # one tile a segment, already held: nothing left to prefetch
            pre = False
        return ScanConfig(bt, config.block_n or h.block_n, config.num_warps or h.num_warps, config.depth,
                          strategy, config.window or h.window, seg, sub, True if l2hint is None else l2hint,
                          h.persist if config.persist is None else config.persist,
                          h.maxnreg if config.maxnreg is None else config.maxnreg, keep, pre)
    if g.mode == "lanes":
        n = math.prod(g.shape)
        if interp:
            bn = min(_np2(n), 64)
        else:
            sms = _sm_count(device)
            bn = min(_np2(n), 128)
            while bn > 32 and math.ceil(n / bn) < 2 * sms:
                bn //= 2
        nw = max(1, min(4, bn // 32))
        return ScanConfig(None, config.block_n or bn, config.num_warps or nw, config.depth)
    widest = max([math.prod(body.states[j].shape) for j in g.states] +
                 [math.prod(body.post_specs[p].shape) for p in g.posts])
    bn = min(_np2(widest), 64 if interp else 1024)
    return ScanConfig(None, config.block_n or bn, config.num_warps or 4, config.depth)


def run_group(body, g, inits, inputs, outs, posts, T: int, config: ScanConfig, deterministic: bool = False):
    k = body.k
    if T <= k:
        return
    device = inits[0].device
    cfg = heuristic(body, g, T, device, config or ScanConfig(), deterministic)
    kern, fns = kernel_for(body, g, cfg, gpu_forms(inits[0], body.compute_dtype))
    tensors = {"x": inputs, "init": inits, "out": outs, "post": posts}
    n = math.prod(g.shape) if g.shape is not None else 0
    extra, tbase, epoch, synced = {}, 0, 1, None
    if kern.mode == "assoc":
        ntiles = math.ceil(n / cfg.block_n)
        if kern.strategy in ("lookback", "segmented"):
            nchunks = math.ceil((T - k) / (cfg.seg if kern.strategy == "segmented" else cfg.block_t))
            grid = work = ntiles * nchunks
            persist = kern.strategy == "segmented" and bool(cfg.persist)
            if persist:  # each program also takes one ticket past the work, which ends its loop
                grid = min(work, cfg.persist * _sm_count(device))
            extra["sync"], tbase, epoch, synced = sync_args(device, 1 + work, work + (grid if persist else 0))
            extra["part"] = torch.empty(nchunks * 2 * kern.ncomp * n, dtype=body.compute_dtype, device=device)
        elif kern.strategy == "packed":  # one zeroed (flag, value) word per chunk and lane
            nchunks = math.ceil((T - k) / cfg.block_t)
            extra["sync"] = torch.zeros(1, dtype=torch.int32, device=device)
            extra["part"] = torch.zeros(nchunks * n, dtype=torch.int64, device=device)
        else:
            nseg = math.ceil((T - k) / cfg.seg)
            extra["sync"] = torch.empty(1, dtype=torch.int32, device=device)
            extra["part"] = torch.empty(nseg * kern.ncomp * n, dtype=body.compute_dtype, device=device)
    elif kern.mode == "coupled":
        extra["ws"] = torch.empty(kern.ws_rows * kern.ws_width, dtype=body.compute_dtype, device=device)
    args = [tensors[a[0]][a[1]] if a[0] in tensors else extra[a[0]] for a in kern.args]

    def launch():
        opts = {"num_warps": cfg.num_warps}
        if kern.mode == "assoc" and cfg.maxnreg:
            opts["maxnreg"] = cfg.maxnreg
        if kern.mode == "assoc" and kern.strategy == "segmented":
            fns[0][(grid,)](*args, T, k, tbase, epoch, BLOCK_T=cfg.block_t, BLOCK_N=cfg.block_n, LB=cfg.window,
                            SEG=cfg.seg, **opts)
        elif kern.mode == "assoc" and kern.strategy in ("lookback", "packed"):
            fns[0][(ntiles * nchunks,)](*args, T, k, tbase, epoch, BLOCK_T=cfg.block_t, BLOCK_N=cfg.block_n,
                                        LB=cfg.window, NSUB=cfg.sub, **opts)
        elif kern.mode == "assoc":
            reduce_, carry, apply_ = fns
            reduce_[(ntiles * nseg,)](*args, T, k, BLOCK_T=cfg.block_t, BLOCK_N=cfg.block_n, SEG=cfg.seg,
                                      num_warps=cfg.num_warps)
            cbn = min(_np2(n), 128 if device.type == "cuda" else 32)  # lanes per program; 8 segments at a time
            carry[(math.ceil(n / cbn),)](*args, T, k, BLOCK_T=min(8, _np2(nseg)), BLOCK_N=cbn, SEG=cfg.seg,
                                         num_warps=max(1, cbn // 128))
            apply_[(ntiles * nseg,)](*args, T, k, BLOCK_T=cfg.block_t, BLOCK_N=cfg.block_n, SEG=cfg.seg,
                                     num_warps=cfg.num_warps)
        elif kern.mode == "lanes":
            fns[0][(math.ceil(n / cfg.block_n),)](*args, T, k, BLOCK=cfg.block_n, num_warps=cfg.num_warps)
        else:
            fns[0][(1,)](*args, T, k, BLOCK=cfg.block_n, num_warps=cfg.num_warps)

    try:
        launch()
    except BaseException:
        if synced is not None:
            # how many tickets a failed launch took is unknown (the interpreter runs programs, each taking one,
            # until one raises; a later launch then waited for flags no program would publish): the next
            # look-back launch on this stream starts on a fresh zeroed buffer
            drop_sync(device)
        raise
    if synced is not None:
        synced()


def integer_coupled(body) -> list[int]:
    """The integer states of ``body``'s coupled groups. ``scan_coupled`` carries a group's states in a workspace of
    the compute dtype (float32, or float64), exact for integers only below 2**24 (2**53): an int64 state near
    2**41 came back off by 4e11 on the triton backend (found 2026-11-29), so such scans run on the reference
    executor instead (``run_forward``)."""
    return [j for g in body.groups if g.mode == "coupled" for j in g.states
            if not body.states[j].dtype.is_floating_point and body.states[j].dtype != torch.bool]


def run_forward(body, inits, inputs, T: int, backend: str, config: ScanConfig | None = None,
                deterministic: bool = False) -> list:
    """Time-major results: the states' histories, or post's outputs when the scan has a post. ``deterministic``:
    the associative groups on a fixed combination order (``heuristic``)."""
    coupled_ints = integer_coupled(body) if backend == "triton" else []
    if coupled_ints:
        import warnings
        warnings.warn(f"evt.scan: {body.name} couples integer state(s) "
                      f"{', '.join(f's{j} ({body.states[j].dtype})' for j in coupled_ints)} with other "
                      "lanes, which the triton kernels carry in a floating-point workspace (exact below 2**24); it "
                      "runs on the reference executor instead (step by step): cast the states to float64 for "
                      "the kernels", stacklevel=4)
        backend = "reference"
    if backend == "reference":
        states, posts = run_reference(body, inits, inputs, T, want_states=body.post is None)
        return posts if body.post is not None else states
    if inits[0].device.type != "cuda" and not knobs.interpreter_active():
        raise RuntimeError("evt.scan(..., backend='triton') on CPU tensors runs the generated kernels in Triton's "
                           "interpreter, which needs TRITON_INTERPRET=1 set before triton is imported; use "
                           "backend='reference' (the CPU default) otherwise")
    inits = [x.contiguous() for x in inits]
    inputs = [x.contiguous() for x in inputs]
    device, k = inits[0].device, body.k
    outs, posts = [], []
    if body.post is None:
        own = {j for g in body.groups if g.mode == "assoc" for j in g.states} if T > k else set()
        for j, (init, spec) in enumerate(zip(inits, body.states)):
            out = torch.empty((T, *spec.shape), dtype=spec.dtype, device=device)
            if j not in own:  # the associative kernels write their init rows themselves (assoc.copy_init)
                out[:k] = init
            outs.append(out)
    else:
        held = [init.to(held_dtype(s.dtype, body.compute_dtype)) for init, s in zip(inits, body.states)]
        head = run_post(body, held, inputs, 0, min(k, T))
        for spec, h in zip(body.post_specs, head):
            out = torch.empty((T, *spec.shape), dtype=spec.dtype, device=device)
            out[:k] = h
            posts.append(out)
    for g in body.groups:
        run_group(body, g, inits, inputs, outs, posts, T, config, deterministic)
    return posts if body.post is not None else outs

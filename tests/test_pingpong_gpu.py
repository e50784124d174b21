"""The Gluon ping-pong template on a Hopper GPU: what neither the interpreter nor an offline compile can show.

Gluon kernels do not run under the Triton interpreter, so the CPU tests only render and compile the template
(tests/test_pingpong.py). Here every epilogue kind (stores, several outputs, row / column / full reductions,
broadcast inputs) runs through the ping-pong kernel on ragged sizes (tiles cut by M, N and K), on a tile count
below and far above the SM count (consumers with unequal tile counts, many ring wraps), with column-major B,
each sub-tiling, and outputs poisoned with NaN, against the fp32 eager reference; and a sequence of launches
and a CUDA-graph replay on fresh data. Run: ``TRITON_INTERPRET=0 pytest -m gpu tests``.
"""
import pytest
import torch

import evtorch as evt
from evtorch.codegen.configs import GemmConfig, device_info
from evtorch.examples import EXAMPLES, Example, eager_reference, operands
from evtorch.runtime.gemm_launch import pingpong_eligible, resolve_config
from evtorch.testing import rel_error

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _hopper_with_gluon():
    if not torch.cuda.is_available() or not device_info().is_hopper:
        return False
    from evtorch.codegen.gluon_template import available

    return available()


needs_hopper = pytest.mark.skipif(not _hopper_with_gluon(), reason="needs a Hopper GPU and Gluon's Hopper API")


def pp(sub: int, stages: int = 5, warps: int = 4, **flags) -> GemmConfig:
    """A 128x128x64 ping-pong config on ``sub`` epilogue slices; ``warps`` per consumer (4 or 8), other flags."""
    return GemmConfig("pingpong", 128, 128, 64, 8, 1, warps, stages,
                      (("EPILOGUE_SUBTILE", sub),) + tuple(flags.items()))


def _check(name, M, N, K, cfg, dtype=torch.bfloat16, b_col=False, seed=0, deterministic=False, ex=None):
    """``EXAMPLES[name]`` (or the ``Example`` ``ex``) through ``cfg`` with outputs poisoned, against eager."""
    torch.manual_seed(seed)
    ex = ex or EXAMPLES[name]
    A, B = operands(M, N, K, "cuda", dtype)
    if b_col:
        B = B.t().contiguous().t()
    assert resolve_config(A, B, cfg).template == "pingpong"
    inputs = ex.make_inputs(M, N, "cuda", dtype)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EVTORCH_POISON", "1")
        out = evt.gemm(A, B, ex.fn, config=cfg, deterministic=deterministic, **inputs)
    ref = eager_reference(ex.fn, A, B, **inputs)
    out = out if isinstance(out, tuple) else (out,)
    ref = ref if isinstance(ref, tuple) else (ref,)
    for i, (o, r) in enumerate(zip(out, ref)):
        assert not torch.isnan(o).any(), f"{name} output {i}: unwritten elements"
        err = rel_error(o, r.to(o.dtype))
        assert err < 1e-2, (name, i, err)


@needs_hopper
@pytest.mark.parametrize("sub", [1, 2, 4])
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_examples_ragged(name, sub):
    # 1000 x 776: the last tile row and column are partial; K = 520 ends mid-tile (TMA zero fill)
    _check(name, 1000, 776, 520, pp(sub))


@needs_hopper
@pytest.mark.parametrize("M,N,K,b_col", [(128, 128, 64, False), (300, 2000, 64, True), (4096, 2048, 1000, False),
                                         (2048, 4096, 4096, True)])
def test_tile_counts_and_layouts(M, N, K, b_col):
    # one tile; fewer tiles than SMs (consumer 1 idle in most programs); many tiles per program (the ring wraps
    # many times, consumers alternate); column-major B
    for name in ("mixed_dag", "row_reduction"):
        _check(name, M, N, K, pp(2), b_col=b_col)


@needs_hopper
def test_fp16_deterministic_and_six_stages():
    # K = 712: rows of 1424 bytes, 16-byte aligned (TMA), not a multiple of BLOCK_K
    _check("mixed_dag", 1500, 1000, 712, pp(4, stages=6), dtype=torch.float16, deterministic=True)
    _check("bce_loss", 1500, 1000, 712, pp(2), dtype=torch.float16, deterministic=True)


@needs_hopper
@pytest.mark.parametrize("sub", [2, 4])
@pytest.mark.parametrize("name", ["lincomb_relu", "column_broadcast", "row_reduction", "bce_loss", "mixed_dag"])
def test_epilogue_input_through_the_loader(name, sub):
    """EPI_TMA: the one M x N input by TMA through the loader warp (mixed_dag, two inputs, keeps pointer loads);
    ragged sizes (TMA zero fill at the edges), many tiles per program (slot sets reused), fp16 and bf16."""
    cfg = pp(sub, stages=4)
    cfg = GemmConfig("pingpong", 128, 128, 64, 8, 1, 4, 4, tuple(cfg.extra) + (("EPI_TMA", True),))
    _check(name, 1000, 776, 520, cfg)
    _check(name, 2048, 2048, 1024, cfg, dtype=torch.float16, seed=1)
    # several tiles per consumer (each consumer's slot set reused, its barriers' phases wrapping), ragged N and K:
    # where three consumers left elements unwritten
    _check(name, 4096, 3000, 1000, cfg, seed=4)


@needs_hopper
def test_first_call_runs_the_loader_kernel(monkeypatch):
    """A signature's first call launches the EPI_TMA kernel, as every later call does (until 2026-11-26 it ran the
    prepared EPI_TMA=False kernel: a one-call check, the selftest's or ``_check``'s above, never ran the loader's
    copies, and the tuner compiled them inside its first timing, in 1-2.5 s on the H100 with the GPU idle)."""
    from evtorch.runtime import gemm as rg
    from evtorch.runtime.gemm_launch import PreparedLaunch

    seen = []
    real = PreparedLaunch._launch
    monkeypatch.setattr(PreparedLaunch, "_launch",
                        lambda self, A, B, args, flags=None: seen.append(flags) or real(self, A, B, args, flags))
    rg.clear_caches()
    cfg = GemmConfig("pingpong", 128, 128, 64, 8, 1, 4, 4, (("EPILOGUE_SUBTILE", True), ("EPI_TMA", True)))
    _check("lincomb_relu", 1024, 640, 512, cfg, seed=3)
    assert seen == [{"EPI_TMA": True, "PREFETCH": 0}]


@needs_hopper
def test_epilogue_input_through_the_loader_falls_back_per_call():
    """An input at a misaligned address (same strides, so the same launch signature) or with a non-unit N stride
    takes the pointer loads; results stay right."""
    ex = EXAMPLES["lincomb_relu"]
    cfg = GemmConfig("pingpong", 128, 128, 64, 8, 1, 4, 4, (("EPILOGUE_SUBTILE", True), ("EPI_TMA", True)))
    M, N, K = 1024, 1024, 512
    A, B = operands(M, N, K, "cuda", torch.bfloat16)
    store = torch.randn(M * N + 8, device="cuda", dtype=torch.bfloat16)
    for C in (store[:M * N].view(M, N), store[1:M * N + 1].view(M, N), torch.randn(N, M, device="cuda",
                                                                                   dtype=torch.bfloat16).t()):
        out = evt.gemm(A, B, ex.fn, config=cfg, C=C, alpha=1.5, beta=0.5)
        ref = eager_reference(ex.fn, A, B, C=C, alpha=1.5, beta=0.5)
        assert rel_error(out, ref.to(out.dtype)) < 1e-2


@needs_hopper
@pytest.mark.parametrize("epi_tma", [False, True])
def test_repeated_launches_and_graph_replay(epi_tma):
    """Fresh A and fresh epilogue input C before every launch and every replay (with EPI_TMA, C comes through the
    loader's TMA copies): a stale or skipped load shows as a wrong result."""
    ex = EXAMPLES["column_broadcast"]
    cfg = GemmConfig("pingpong", 128, 128, 64, 8, 1, 4, 4, (("EPILOGUE_SUBTILE", True), ("EPI_TMA", True))) \
        if epi_tma else pp(2)
    M, N, K = 2048, 1536, 768
    A, B = operands(M, N, K, "cuda", torch.bfloat16)
    inputs = ex.make_inputs(M, N, "cuda", torch.bfloat16)
    C = inputs["C"]
    for _ in range(3):
        A.copy_(torch.randn_like(A) * K ** -0.25)
        C.copy_(torch.randn_like(C))
        Z, T = evt.gemm(A, B, ex.fn, config=cfg, **inputs)
        rz, rt = eager_reference(ex.fn, A, B, **inputs)
        assert rel_error(Z, rz.to(Z.dtype)) < 1e-2 and rel_error(T, rt.to(T.dtype)) < 1e-2
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        evt.gemm(A, B, ex.fn, config=cfg, **inputs)  # warm: compile outside the capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        Z, T = evt.gemm(A, B, ex.fn, config=cfg, **inputs)
    for _ in range(3):
        A.copy_(torch.randn_like(A) * K ** -0.25)
        C.copy_(torch.randn_like(C))
        g.replay()
        torch.cuda.synchronize()
        rz, rt = eager_reference(ex.fn, A, B, **inputs)
        assert rel_error(Z, rz.to(Z.dtype)) < 1e-2 and rel_error(T, rt.to(T.dtype)) < 1e-2


@needs_hopper
def test_out_of_scope_operands_fall_back():
    A, B = operands(512, 512, 256, "cuda", torch.bfloat16)
    assert pingpong_eligible(A, B)
    At = A.t().contiguous().t()  # column-major A
    assert not pingpong_eligible(At, B) and resolve_config(At, B, pp(2)).template == "persistent_tma"
    A3 = torch.stack([A, A])
    assert resolve_config(A3, B, pp(2)).template == "persistent_tma"
    ex = EXAMPLES["lincomb_relu"]
    inputs = ex.make_inputs(512, 512, "cuda", torch.bfloat16)
    out = evt.gemm(At, B, ex.fn, config=pp(2), **inputs)
    assert rel_error(out, eager_reference(ex.fn, At, B, **inputs).to(out.dtype)) < 1e-2


def wg(sub: int = 4, slots: int = 2, stages: int = 3) -> GemmConfig:
    return GemmConfig("pingpong", 128, 256, 64, 8, 1, 4, stages, (("EPILOGUE_SUBTILE", sub), ("EPI_WG", slots)))


@needs_hopper
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_epilogue_warpgroup_schedule(name):
    """EPI_WG: every epilogue kind through the hand-off ring, ragged (1000 x 776 x 520: partial tiles, K ends
    mid-step), one tile per program or fewer, and many tiles per program (4096 x 4096: ~4 per program, the
    ring's slots and phases wrap many times) with column-major B and the 2-stage / 3-slot variant."""
    _check(name, 1000, 776, 520, wg())
    _check(name, 4096, 4096, 768, wg(slots=3, stages=2), b_col=True, seed=1)
    _check(name, 4096, 3000, 1000, wg(), dtype=torch.float16, seed=2, deterministic=True)


def es(sub: int = 4, bufs: int = 1, stages: int = 4, **flags) -> GemmConfig:
    return GemmConfig("pingpong", 128, 128, 64, 8, 1, 4, stages,
                      (("EPILOGUE_SUBTILE", sub), ("EPI_SMEM", bufs)) + tuple(flags.items()))


@needs_hopper
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_epilogue_loop_from_shared_memory(name):
    """EPI_SMEM: every epilogue kind run as a loop over slices read back from the consumer's accumulator buffer:
    ragged (partial tiles, K ends mid-step) with the shared buffer and the one-slice-ahead prefetch (the last
    slice's prefetch must load nothing), many tiles per program (the shared buffer's turn barriers wrap many
    times; column-major B; no prefetch), and a half-tile buffer per consumer (EPI_SMEM=2, on quarters and on
    halves) in fp16, deterministic; then eighths through either buffer (the two-slice iterations)."""
    _check(name, 1000, 776, 520, es())
    _check(name, 4096, 4096, 768, es(PREFETCH=0), b_col=True, seed=1)
    _check(name, 4096, 3000, 1000, es(bufs=2), dtype=torch.float16, seed=2, deterministic=True)
    _check(name, 1000, 776, 520, es(sub=2, bufs=2, PREFETCH=0), seed=3)
    # eighths (128 x 16 slices), through the shared buffer and a half-tile buffer each
    _check(name, 1000, 776, 520, es(sub=8), seed=4)
    _check(name, 4096, 3000, 1000, es(sub=8, bufs=2), dtype=torch.float16, seed=5)


@needs_hopper
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_three_consumers(name):
    """CONSUMERS=3: every epilogue kind with three consumer warpgroups taking the program's tiles in turn: the
    loop through the ring of two whole-tile buffers (ragged; many tiles per program, so the turn and buffer
    barriers wrap many times, column-major B; eighths), slices from registers (fp16, deterministic), and the
    rejected combination with the loader's input ring (EPI_TMA: it left elements unwritten, tests/test_pingpong.py)."""
    _check(name, 1000, 776, 520, pp(4, 3, CONSUMERS=3, EPI_SMEM=1, PREFETCH=0))
    _check(name, 4096, 4096, 768, pp(4, 3, CONSUMERS=3, EPI_SMEM=1, PREFETCH=0), b_col=True, seed=1)
    _check(name, 1000, 776, 520, pp(8, 3, CONSUMERS=3, EPI_SMEM=1, PREFETCH=0), seed=2)
    _check(name, 4096, 3000, 1000, pp(4, 4, CONSUMERS=3, PREFETCH=0), dtype=torch.float16, seed=3, deterministic=True)
    # fewer tiles than programs; the prefetched loop
    _check(name, 300, 200, 64, pp(4, 3, CONSUMERS=3, EPI_SMEM=1), seed=5)


@needs_hopper
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_two_warpgroup_consumers(name):
    """num_warps=8: every epilogue kind with consumers of two warpgroups (each wgmma on 64 rows of the tile, the
    ring slot freed only after both have read it): ragged halves with the prefetch rule; many tiles per program
    (the turn barriers wrap many times) with column-major B on quarters without prefetch; the loader's input
    ring (EPI_TMA) in fp16, deterministic; the loop from the shared whole-tile buffer; the whole tile at once;
    fewer tiles than programs."""
    _check(name, 1000, 776, 520, pp(2, 5, warps=8))
    _check(name, 4096, 4096, 768, pp(4, 5, warps=8, PREFETCH=0), b_col=True, seed=1)
    _check(name, 4096, 3000, 1000, pp(4, 4, warps=8, EPI_TMA=True), dtype=torch.float16, seed=2, deterministic=True)
    _check(name, 1000, 776, 520, pp(4, 4, warps=8, EPI_SMEM=1), seed=3)
    _check(name, 2048, 1024, 4096, pp(1, 5, warps=8, PREFETCH=0), seed=4)
    _check(name, 300, 200, 64, pp(2, 4, warps=8, EPI_SMEM=1), seed=5)


@needs_hopper
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_epilogue_register_loop(name):
    """EPI_LOOP: every epilogue kind with the consumers' epilogue as a runtime loop over slices carried in
    registers: ragged halves with the prefetch rule (the next slice's inputs carried into the next iteration);
    many tiles per program with column-major B on quarters without prefetch; the loader's input ring (EPI_TMA) in
    fp16, deterministic; consumers of two warpgroups on quarters; fewer tiles than programs."""
    _check(name, 1000, 776, 520, pp(2, 5, EPI_LOOP=True))
    _check(name, 4096, 4096, 768, pp(4, 5, EPI_LOOP=True, PREFETCH=0), b_col=True, seed=1)
    _check(name, 4096, 3000, 1000, pp(4, 4, EPI_LOOP=True, EPI_TMA=True), dtype=torch.float16, seed=2,
           deterministic=True)
    _check(name, 1000, 776, 520, pp(4, 5, warps=8, EPI_LOOP=True), seed=3)
    _check(name, 4096, 3000, 1000, pp(4, 4, warps=8, EPI_LOOP=True, EPI_TMA=True), seed=4)
    _check(name, 300, 200, 64, pp(2, 5, EPI_LOOP=True), seed=5)


@needs_hopper
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_register_loop_in_mma_layout(name):
    """EPI_LOOP with EPI_MMA (and TMA_STORE): the runtime loop over register-carried slices in the wgmma layout,
    every epilogue kind: ragged halves with the prefetch rule; the loader's input ring in fp16, deterministic;
    tile outputs stored by TMA from the loop (output 0 into the input's slice buffer) on quarters with many tiles
    per program and column-major B; TMA stores without the loader; consumers of two warpgroups; fewer tiles than
    programs."""
    _check(name, 1000, 776, 520, pp(2, 5, EPI_LOOP=True, EPI_MMA=True))
    _check(name, 4096, 3000, 1000, pp(2, 4, EPI_LOOP=True, EPI_MMA=True, EPI_TMA=True), dtype=torch.float16,
           seed=2, deterministic=True)
    _check(name, 4096, 4096, 768, pp(4, 4, EPI_LOOP=True, EPI_MMA=True, EPI_TMA=True, TMA_STORE=2), b_col=True,
           seed=1)
    _check(name, 1000, 776, 520, pp(2, 4, EPI_LOOP=True, EPI_MMA=True, TMA_STORE=2), seed=3)
    _check(name, 1000, 776, 520, pp(4, 4, warps=8, EPI_LOOP=True, EPI_MMA=True, EPI_TMA=True), seed=4)
    _check(name, 300, 200, 64, pp(2, 5, EPI_LOOP=True, EPI_MMA=True), seed=5)


@needs_hopper
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_epilogue_in_mma_layout(name):
    """EPI_MMA: every epilogue kind computed in the accumulator's wgmma layout (its loads, stores, broadcasts,
    reductions and atomics in that layout): ragged halves with the prefetch rule; many tiles with column-major B
    on quarters; the loader's input ring (EPI_TMA, the tuner's use) in fp16, deterministic; consumers of two
    warpgroups; fewer tiles than programs; the tuner's config (the loader's ring on five stages,
    policy.MMA_TMA_STAGES) on ragged tiles with column-major B, deterministic."""
    _check(name, 1000, 776, 520, pp(2, 5, EPI_MMA=True))
    _check(name, 4096, 4096, 768, pp(4, 5, EPI_MMA=True, PREFETCH=0), b_col=True, seed=1)
    _check(name, 4096, 3000, 1000, pp(2, 4, EPI_MMA=True, EPI_TMA=True), dtype=torch.float16, seed=2,
           deterministic=True)
    _check(name, 1000, 776, 520, pp(4, 4, warps=8, EPI_MMA=True, EPI_TMA=True), seed=3)
    _check(name, 300, 200, 64, pp(2, 5, EPI_MMA=True), seed=4)
    _check(name, 4096, 3000, 1000, pp(2, 5, EPI_MMA=True, EPI_TMA=True), b_col=True, seed=6, deterministic=True)


def _launch_flags(name, A, B, cfg, **inputs) -> dict:
    """The constexprs the ping-pong kernel of ``evt.gemm(A, B, EXAMPLES[name].fn, config=cfg)`` was launched with."""
    from evtorch.runtime import gemm as runtime_gemm

    runtime_gemm._launches.clear()
    evt.gemm(A, B, EXAMPLES[name].fn, config=cfg, **inputs)
    (launch,) = runtime_gemm._launches.values()
    return launch.gemm.common


@needs_hopper
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_tile_outputs_stored_by_tma(name):
    """TMA_STORE: every epilogue kind with its M x N outputs written into shared buffers and stored by TMA (rows
    and columns past M and N clipped by the TMA unit): ragged halves in the wgmma layout with the prefetch rule;
    the loader's input ring (EPI_TMA: output 0 takes the input's slice buffer, released at the next main loop)
    with many tiles per program, column-major B, fp16, deterministic; quarters in the blocked layout; consumers of
    two warpgroups; fewer tiles than programs."""
    _check(name, 1000, 776, 520, pp(2, 4, EPI_MMA=True, TMA_STORE=2))
    _check(name, 4096, 4096, 768, pp(2, 4, EPI_MMA=True, EPI_TMA=True, TMA_STORE=2), b_col=True, seed=1)
    _check(name, 4096, 3000, 1000, pp(4, 4, EPI_MMA=True, EPI_TMA=True, TMA_STORE=2), dtype=torch.float16,
           seed=2, deterministic=True)
    _check(name, 1000, 776, 520, pp(4, 5, TMA_STORE=2, PREFETCH=0), seed=3)
    _check(name, 1000, 776, 520, pp(4, 4, warps=8, EPI_MMA=True, EPI_TMA=True, TMA_STORE=2), seed=4)
    _check(name, 300, 200, 64, pp(2, 4, EPI_MMA=True, TMA_STORE=2), seed=5)


def _bias_gelu_aux(acc, bias):
    pre = acc + bias
    return torch.nn.functional.gelu(pre, approximate="tanh"), pre


# epilogues without M x N inputs, whose tile outputs the tuner stores by TMA
_INPUTLESS = {"identity": Example(lambda acc: acc, lambda M, N, device, dtype: {}),
              "bias_gelu_aux": Example(_bias_gelu_aux, lambda M, N, device, dtype: {
                  "bias": torch.randn(N, device=device, dtype=dtype)})}


@needs_hopper
@pytest.mark.parametrize("name", sorted(_INPUTLESS) + sorted(EXAMPLES))
def test_deep_ring_in_mma_layout(name):
    """The deep ring (DEEP_RING_STAGES) in the wgmma layout with TMA-stored outputs on the fewest slices whose
    output buffers fit beside six stages (one output: halves; two: quarters): for an epilogue without M x N inputs,
    the config the tuner converts it to (``policy.for_epilogue``), on ragged tiles, many per program, with
    column-major B, and in fp16, deterministic; every example forced onto it too (those with M x N inputs load
    them in the wgmma layout)."""
    from evtorch.api import get_epilogue
    from evtorch.codegen.policy import DEEP_RING_STAGES, for_epilogue
    from evtorch.codegen.program import build_program

    ex = _INPUTLESS.get(name) or EXAMPLES[name]
    small = ex.make_inputs(64, 64, "cuda", torch.bfloat16)
    code = build_program(get_epilogue(ex.fn, (64, 64), torch.float32, small), out_dtype=torch.bfloat16).epilogue
    stored = len(code.tma_outputs)
    cfg = pp(2 if stored <= 1 else 4, DEEP_RING_STAGES, EPI_MMA=True, TMA_STORE=max(1, stored))
    if name in _INPUTLESS:  # the tuner's own conversion of the deep ring
        (tuned,) = for_epilogue([pp(2, DEEP_RING_STAGES)], tma_input=False, tile_stores=code.tile_stores,
                                tma_outputs=stored, tile_inputs=code.prefetch, dtype=torch.bfloat16,
                                info=device_info())
        assert tuned == cfg, (tuned, cfg)
    _check(name, 4096, 3000, 1000, cfg, b_col=True, seed=7, ex=ex)
    _check(name, 1000, 776, 520, cfg, dtype=torch.float16, seed=8, deterministic=True, ex=ex)


@needs_hopper
def test_tma_store_only_where_the_outputs_allow():
    """The launcher keeps TMA_STORE (and, for a tile-storing epilogue, EPI_MMA) only where every TMA-stored output
    has a 16-byte row pitch: N = 1001 (column-major B keeps the operands TMA-able) runs without both, correctly;
    N = 1000 runs with both (column_broadcast: two M x N outputs, one M x N input)."""
    cfg = pp(2, 4, EPI_MMA=True, TMA_STORE=2)
    for N, on in ((1000, True), (1001, False)):
        A, B = operands(512, N, 256, "cuda", torch.bfloat16)
        B = B.t().contiguous().t()
        inputs = EXAMPLES["column_broadcast"].make_inputs(512, N, "cuda", torch.bfloat16)
        flags = _launch_flags("column_broadcast", A, B, cfg, **inputs)
        assert bool(flags["TMA_STORE"]) == on and flags["EPI_MMA"] == on, (N, flags)
        _check("column_broadcast", 512, N, 256, cfg, b_col=True, seed=N)

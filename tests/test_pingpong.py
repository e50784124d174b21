"""The Gluon ping-pong template without a GPU: rendering, config rules, launcher fallback, and an sm_90 compile.

Gluon kernels do not run under the Triton interpreter; the GPU tests (tests/test_pingpong_gpu.py) run them. Here
the template must render for every epilogue, compile for sm_90 with the installed Triton (Triton's bundled
ptxas; this is what catches a Gluon API change), and a ping-pong config must run everywhere else by falling
back to the persistent TMA template.
"""
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import evtorch as evt
from evtorch.codegen import gluon_template
from evtorch.codegen.configs import DeviceInfo, GemmConfig, fits_smem
from evtorch.codegen.policy import DEEP_RING_STAGES, MMA_TMA_STAGES, candidate_configs, for_epilogue
from evtorch.examples import EXAMPLES, eager_reference
from evtorch.runtime.gemm_launch import grid_tiles, resolve_config

ROOT = Path(__file__).resolve().parents[1]
H200 = DeviceInfo("cuda", "H200", (9, 0), 132, 232448)
needs_gluon = pytest.mark.skipif(not gluon_template.available(), reason="installed Triton lacks Gluon's Hopper API")


def pp(sub=2, **flags):
    return GemmConfig("pingpong", 128, 128, 64, 8, 1, 4, 5, (("EPILOGUE_SUBTILE", sub),) + tuple(flags.items()))


def test_config_rules():
    assert pp(4, PREFETCH=0).short() == "pingpong_128x128x64_g8_w4_s5_epilogue_subtile4_prefetch0"
    assert pp(2) != pp(2, PREFETCH=0)
    with pytest.raises(ValueError, match="num_warps must be 4 or 8"):
        GemmConfig("pingpong", 128, 128, 64, 8, 1, 16, 5)
    with pytest.raises(ValueError, match="FLATTEN"):
        pp(2, FLATTEN=True)
    with pytest.raises(ValueError, match="one slice ahead"):
        pp(4, PREFETCH=2)
    with pytest.raises(ValueError, match="multiple of 64"):
        GemmConfig("pingpong", 32, 128, 64, 8, 1, 4, 5)
    # the rule: one slice ahead for one M x N input, none for two (their registers spill), the flag wins
    assert (pp(2).prefetch_slices(1, 2), pp(2).prefetch_slices(2, 2), pp(2).prefetch_slices(0, 2)) == (1, 0, 0)
    assert pp(4, PREFETCH=0).prefetch_slices(1, 2) == 0
    assert pp(4).is_persistent and grid_tiles(1000, 1000, pp(4)) == (8, 32)
    # EPI_TMA: ping-pong only, its shared-memory ring counted, dropped when the config falls back
    with pytest.raises(ValueError, match="EPI_TMA only applies"):
        GemmConfig("persistent_tma", 128, 128, 64, 8, 1, 8, 3, (("EPI_TMA", True),))
    assert pp(2, EPI_TMA=True).smem_bytes(2) == pp(2).smem_bytes(2) + 2 * 128 * 128 * 2
    # with three consumers it left output elements unwritten on an H100 (tests/test_pingpong_gpu.py): rejected
    with pytest.raises(ValueError, match="EPI_TMA .* two consumers only, got CONSUMERS=3"):
        pp(4, EPI_TMA=True, CONSUMERS=3)
    A, B = torch.randn(64, 32), torch.randn(32, 64)
    assert dict(resolve_config(A, B, pp(2, EPI_TMA=True)).extra) == {"EPILOGUE_SUBTILE": True}


def wg(sub=4, slots=2, stages=3, **flags):
    return GemmConfig("pingpong", 128, 256, 64, 8, 1, 4, stages,
                      (("EPILOGUE_SUBTILE", sub), ("EPI_WG", slots)) + tuple(flags.items()))


def test_epilogue_warpgroup_config_rules():
    """EPI_WG: two MMA warpgroups need BLOCK_M 128; the loader's EPI_TMA ring is ping-pong's; the hand-off ring
    counts in shared memory (and decides what fits); a fallback to persistent_tma drops the flag."""
    assert wg().short() == "pingpong_128x256x64_g8_w4_s3_epilogue_subtile4_epi_wg2"
    assert wg(slots=0) == GemmConfig("pingpong", 128, 256, 64, 8, 1, 4, 3, (("EPILOGUE_SUBTILE", 4),))
    with pytest.raises(ValueError, match="EPI_WG=2 needs BLOCK_M == 128"):
        GemmConfig("pingpong", 256, 128, 64, 8, 1, 4, 3, (("EPI_WG", 2),))
    with pytest.raises(ValueError, match="no EPI_TMA"):
        wg(EPI_TMA=True)
    with pytest.raises(ValueError, match="must be one of"):
        wg(slots=1)
    with pytest.raises(ValueError, match="EPI_WG only applies"):
        GemmConfig("persistent_tma", 128, 256, 64, 8, 1, 8, 3, (("EPI_WG", 2),))
    ring = (128 * 64 + 64 * 256) * 2
    assert wg().smem_bytes(2) == 3 * ring + 2 * 128 * 64 * 4
    assert wg(slots=3, stages=2).smem_bytes(2) == 2 * ring + 3 * 128 * 64 * 4
    from evtorch.codegen.configs import fits_smem
    assert fits_smem(wg(), torch.bfloat16, H200) and fits_smem(wg(slots=3, stages=2), torch.bfloat16, H200)
    assert not fits_smem(wg(slots=3), torch.bfloat16, H200) and not fits_smem(wg(sub=2), torch.bfloat16, H200)
    A, B = torch.randn(64, 32), torch.randn(32, 64)
    fell = resolve_config(A, B, wg())
    assert fell.template == "persistent_tma" and dict(fell.extra) == {"EPILOGUE_SUBTILE": 4}


def test_epilogue_loop_config_rules():
    """EPI_SMEM: 1 (a whole-tile buffer the consumers share) or 2 (a half-tile buffer each, halves of two or four
    slices), either 64 KiB of fp32 in shared memory, which fits beside a 4-stage ring, not a 5-stage one; not with
    the loader's EPI_TMA input or the EPI_WG schedule; dropped by the fallback. The template's 128-byte swizzled
    TMA tiles need BLOCK_K and BLOCK_N of 64 or more (a 32-deep K step failed inside Triton's TMA lowering)."""
    es = pp(4, EPI_SMEM=1)
    assert es.short() == "pingpong_128x128x64_g8_w4_s5_epilogue_subtile4_epi_smem1"
    assert pp(4, EPI_SMEM=0) == pp(4)
    ring = (128 * 64 + 64 * 128) * 2
    assert es.smem_bytes(2) == pp(2, EPI_SMEM=2).smem_bytes(2) == 5 * ring + 128 * 128 * 4
    from evtorch.codegen.configs import fits_smem
    assert fits_smem(dataclasses.replace(es, num_stages=4), torch.bfloat16, H200)
    assert not fits_smem(es, torch.bfloat16, H200)  # 5 x 32 KiB + 64 KiB
    with pytest.raises(ValueError, match="must be one of"):
        pp(4, EPI_SMEM=3)
    with pytest.raises(ValueError, match="EPI_SMEM=2 .* needs EPILOGUE_SUBTILE 2, 4 or 8"):
        pp(1, EPI_SMEM=2)
    # eighths (128 x 16 slices) only in the loop: eight inlined copies per consumer would crowd the instruction
    # cache, and the persistent template splits into four at most; the fallback takes quarters
    assert pp(8, EPI_SMEM=1).epilogue_subtiles == pp(8, EPI_SMEM=2).epilogue_subtiles == 8
    with pytest.raises(ValueError, match="EPILOGUE_SUBTILE=8 needs template='pingpong' with EPI_SMEM"):
        pp(8)
    with pytest.raises(ValueError, match="EPILOGUE_SUBTILE=8 needs template='pingpong' with EPI_SMEM"):
        GemmConfig("persistent_tma", 128, 256, 64, 8, 1, 8, 3, (("EPILOGUE_SUBTILE", 8),))
    with pytest.raises(ValueError, match="EPILOGUE_SUBTILE=8 needs BLOCK_N >= 128"):
        GemmConfig("pingpong", 128, 64, 64, 8, 1, 4, 4, (("EPILOGUE_SUBTILE", 8), ("EPI_SMEM", 1)))
    fell8 = resolve_config(torch.randn(64, 32), torch.randn(32, 64), pp(8, EPI_SMEM=2))
    assert fell8.template == "persistent_tma" and dict(fell8.extra) == {"EPILOGUE_SUBTILE": 4}
    with pytest.raises(ValueError, match="not with EPI_TMA or EPI_WG"):
        pp(4, EPI_SMEM=1, EPI_TMA=True)
    with pytest.raises(ValueError, match="not with EPI_TMA or EPI_WG"):
        GemmConfig("pingpong", 128, 256, 64, 8, 1, 4, 3, (("EPI_WG", 2), ("EPI_SMEM", 1)))
    with pytest.raises(ValueError, match="EPI_SMEM only applies"):
        GemmConfig("persistent_tma", 128, 256, 64, 8, 1, 8, 3, (("EPI_SMEM", 1),))
    with pytest.raises(ValueError, match="BLOCK_K >= 64 and BLOCK_N >= 64 .* got BLOCK_K=32"):
        GemmConfig("pingpong", 128, 128, 32, 8, 1, 4, 4)
    fell = resolve_config(torch.randn(64, 32), torch.randn(32, 64), es)
    assert fell.template == "persistent_tma" and dict(fell.extra) == {"EPILOGUE_SUBTILE": 4}


def test_epilogue_register_loop_config_rules():
    """EPI_LOOP: the consumers' epilogue looped over 2 or 4 slices in registers; not with EPI_SMEM (the other
    loop) or EPI_WG, not on the whole tile or eighths; with EPI_TMA and two-warpgroup consumers; no shared memory of
    its own; dropped by the fallback."""
    el = pp(4, EPI_LOOP=True)
    assert el.short() == "pingpong_128x128x64_g8_w4_s5_epilogue_subtile4_epi_loop"
    assert pp(4, EPI_LOOP=False) == pp(4) and el.smem_bytes(2) == pp(4).smem_bytes(2)
    assert GemmConfig("pingpong", 128, 128, 64, 8, 1, 8, 4,
                      (("EPILOGUE_SUBTILE", 2), ("EPI_LOOP", True), ("EPI_TMA", True))).flag("EPI_LOOP")
    for bad in (dict(sub=1), dict(sub=8, EPI_SMEM=1), dict(sub=4, EPI_SMEM=2)):
        with pytest.raises(ValueError, match="EPI_LOOP .* needs EPILOGUE_SUBTILE 2 or 4 and no EPI_SMEM or EPI_WG"):
            pp(bad.pop("sub"), EPI_LOOP=True, **bad)
    with pytest.raises(ValueError, match="EPI_LOOP .* needs EPILOGUE_SUBTILE 2 or 4 and no EPI_SMEM or EPI_WG"):
        GemmConfig("pingpong", 128, 256, 64, 8, 1, 4, 3, (("EPILOGUE_SUBTILE", 4), ("EPI_WG", 2), ("EPI_LOOP", True)))
    with pytest.raises(ValueError, match="EPI_LOOP only applies"):
        GemmConfig("persistent_tma", 128, 256, 64, 8, 1, 8, 3, (("EPI_LOOP", True),))
    fell = resolve_config(torch.randn(64, 32), torch.randn(32, 64), el)
    assert fell.template == "persistent_tma" and dict(fell.extra) == {"EPILOGUE_SUBTILE": 4}


def test_epilogue_in_mma_layout_config_rules():
    """EPI_MMA: a ping-pong flag (the epilogue in the accumulator's wgmma layout) for slices from registers, with
    any slicing, EPI_TMA, two-warpgroup consumers and the register loop (EPI_LOOP); not with the EPI_SMEM loop or
    the EPI_WG schedule;
    no shared memory of its own (it saves the conversion's scratch); dropped by the fallback."""
    mma = pp(2, EPI_MMA=True, EPI_TMA=True)
    assert mma.short() == "pingpong_128x128x64_g8_w4_s5_epilogue_subtile_epi_mma_epi_tma"
    # the launcher passes the kernel's schedule constexprs from one table: every one is a kernel parameter
    from evtorch.codegen.configs import PINGPONG_KERNEL_DEFAULTS
    assert pp(2).pingpong_flags() == PINGPONG_KERNEL_DEFAULTS
    assert mma.pingpong_flags() == {**PINGPONG_KERNEL_DEFAULTS, "EPI_MMA": True}
    kernel = gluon_template.render_pingpong("k", "epi", []).split("\ndef k(")[1].split("):")[0]
    assert all(f"{name}: gl.constexpr" in kernel for name in PINGPONG_KERNEL_DEFAULTS)
    assert pp(2, EPI_MMA=False) == pp(2) and mma.smem_bytes(2) == pp(2, EPI_TMA=True).smem_bytes(2)
    assert GemmConfig("pingpong", 128, 128, 64, 8, 1, 8, 4, (("EPILOGUE_SUBTILE", 4), ("EPI_MMA", True))).flag("EPI_MMA")
    with pytest.raises(ValueError, match="EPI_MMA .* not with EPI_SMEM or EPI_WG"):
        pp(2, EPI_MMA=True, EPI_SMEM=1)
    assert pp(2, EPI_MMA=True, EPI_TMA=True, EPI_LOOP=True).flag("EPI_LOOP")
    with pytest.raises(ValueError, match="EPI_MMA only applies"):
        GemmConfig("persistent_tma", 128, 256, 64, 8, 1, 8, 3, (("EPI_MMA", True),))
    fell = resolve_config(torch.randn(64, 32), torch.randn(32, 64), mma)
    assert fell.template == "persistent_tma" and dict(fell.extra) == {"EPILOGUE_SUBTILE": True}


def test_tile_stores_says_whether_the_epilogue_writes_an_m_by_n_tile():
    """EpilogueCode.tile_stores (what for_epilogue's EPI_MMA rule reads): False for a loss (a scalar out of a
    reduction) and for row sums alone, True where an M x N output is stored."""
    from evtorch.api import get_epilogue
    from evtorch.codegen.program import build_program

    def tile_stores(fn, **inputs):
        ep = get_epilogue(fn, (64, 32), torch.float32, inputs)
        return build_program(ep, out_dtype=torch.float16).epilogue.tile_stores

    C = torch.randn(64, 32)
    assert not tile_stores(lambda acc, C: (acc * C).sum(), C=C)
    assert not tile_stores(lambda acc: torch.tanh(acc).sum(dim=1))
    assert tile_stores(lambda acc, C: torch.relu(acc + C), C=C)
    assert tile_stores(lambda acc: (acc, acc.sum(dim=0)))


def test_tma_store_config_rules():
    """TMA_STORE = T: a ping-pong flag (the consumers' T tile outputs stored by TMA) for slices from registers,
    with any slicing, EPI_TMA, EPI_MMA, two-warpgroup consumers and the register loop (EPI_LOOP); not with the
    EPI_SMEM loop or the EPI_WG schedule; a 16-bit slice buffer per consumer and output, but the one output that takes the EPI_TMA
    input's slice buffer; passed to the kernel as a constexpr; dropped by the fallback."""
    ts = pp(2, EPI_MMA=True, TMA_STORE=2)
    assert ts.short() == "pingpong_128x128x64_g8_w4_s5_epilogue_subtile_epi_mma_tma_store2"
    assert ts.pingpong_flags()["TMA_STORE"] == 2 and pp(2, TMA_STORE=0) == pp(2)
    slice_bytes = 2 * 128 * 64 * 2  # two consumers, one [128, 64] 16-bit slice each
    assert ts.smem_bytes(2) == pp(2).smem_bytes(2) + 2 * slice_bytes
    assert pp(4, TMA_STORE=1).smem_bytes(2) == pp(4).smem_bytes(2) + slice_bytes // 2
    with_input = pp(2, EPI_TMA=True)
    assert pp(2, EPI_TMA=True, TMA_STORE=1).smem_bytes(2) == with_input.smem_bytes(2)
    assert pp(2, EPI_TMA=True, TMA_STORE=2).smem_bytes(2) == with_input.smem_bytes(2) + slice_bytes
    with pytest.raises(ValueError, match="TMA_STORE=1 .* not with EPI_SMEM or EPI_WG"):
        pp(2, TMA_STORE=1, EPI_SMEM=1)
    assert pp(4, EPI_MMA=True, TMA_STORE=1, EPI_LOOP=True).smem_bytes(2) == pp(4, TMA_STORE=1).smem_bytes(2)
    with pytest.raises(ValueError, match="TMA_STORE=1 .* not with EPI_SMEM or EPI_WG"):
        GemmConfig("pingpong", 128, 256, 64, 8, 1, 4, 3, (("EPILOGUE_SUBTILE", 4), ("EPI_WG", 2), ("TMA_STORE", 1)))
    with pytest.raises(ValueError, match=r"TMA_STORE'\] must be one of"):
        pp(2, TMA_STORE=9)
    with pytest.raises(ValueError, match="TMA_STORE only applies"):
        GemmConfig("persistent_tma", 128, 256, 64, 8, 1, 8, 3, (("TMA_STORE", 1),))
    fell = resolve_config(torch.randn(64, 32), torch.randn(32, 64), ts)
    assert fell.template == "persistent_tma" and dict(fell.extra) == {"EPILOGUE_SUBTILE": True}


def test_tma_outputs_are_the_m_by_n_tile_outputs():
    """EpilogueCode.tma_outputs: the outputs stored over exactly (M, N), in the order ``<fn>_st`` / ``<fn>_pf_st``
    return them (in the output dtype, broadcast to the slice), which store everything else themselves; none for
    a loss or vector outputs (no ``_st`` functions then). The rendered kernel stores each returned output by TMA."""
    from evtorch.api import get_epilogue
    from evtorch.codegen.program import build_program

    def code(fn, **inputs):
        ep = get_epilogue(fn, (64, 32), torch.float32, inputs)
        return build_program(ep, out_dtype=torch.float16)

    C, v = torch.randn(64, 32), torch.randn(64)
    prog = code(lambda acc, C, v: (torch.relu(acc + C), acc.sum(dim=1), v[:, None] + acc * 0, acc + 1), C=C, v=v)
    epi = prog.epilogue
    assert [(ptr, strides, pos) for ptr, strides, pos in epi.tma_outputs] == [
        ("out0", {"M": "so0_M", "N": "so0_N"}, 0), ("out2", {"M": "so2_M", "N": "so2_N"}, 2),
        ("out3", {"M": "so3_M", "N": "so3_N"}, 3)]
    st = epi.source.split("def epilogue_pf_st(")[1]
    returned = st.split("return ")[1].split("\n")[0]
    assert returned.count(".dtype.element_ty)") == 3 and "out1" not in returned
    assert "tl.store(out0" not in st and "tl.store(out2" not in st and "tl.atomic_add(out1" in st
    assert "def epilogue_st(" in epi.source
    kernel = prog.source.split(f"def {prog.kernel_base}_pingpong(")[1]
    assert kernel.count("tma.make_tensor_descriptor(out") == 3 and "o_desc2, o_bufs2" in prog.source
    assert "epilogue_pf_st(acc_e" in prog.source and "tma_store(o_desc2" in prog.source
    loss = code(lambda acc, C: (acc * C).sum(), C=C).epilogue
    assert loss.tma_outputs == [] and "_st(" not in loss.source
    vec = code(lambda acc: (acc.sum(dim=0), torch.tanh(acc).amax(dim=1))).epilogue
    assert vec.tma_outputs == [] and "_st(" not in vec.source
    with pytest.raises(ValueError, match="tma_outputs pointer"):
        gluon_template.render_pingpong("k", "epi", [], tma_outputs=(("o-1", "s"),))


def test_three_consumers_config_rules():
    """CONSUMERS: 2 (the default, dropped from ``extra``) or 3 consumer warpgroups, ping-pong only, not the EPI_WG
    schedule; with EPI_SMEM = 1 the loop's ring has CONSUMERS - 1 whole-tile buffers (two: 128 KiB, which leaves
    a 3-stage ring), with EPI_SMEM = 2 a half tile per consumer, not with EPI_TMA (test_config_rules); the
    fallback to persistent_tma drops it."""
    assert pp(4, CONSUMERS=2) == pp(4)
    c3 = pp(4, EPI_SMEM=1, CONSUMERS=3, PREFETCH=0)
    assert c3.short() == "pingpong_128x128x64_g8_w4_s5_consumers3_epilogue_subtile4_epi_smem1_prefetch0"
    ring = (128 * 64 + 64 * 128) * 2
    tile = 128 * 128 * 4
    assert dataclasses.replace(c3, num_stages=3).smem_bytes(2) == 3 * ring + 2 * tile
    assert pp(4, EPI_SMEM=2, CONSUMERS=3).smem_bytes(2) == 5 * ring + 3 * tile // 2
    from evtorch.codegen.configs import fits_smem
    # 3 x 32 KiB + 128 KiB compiles (229.4-232.6 KB of the H200's 232448 bytes with Triton's reduction scratch:
    # halves with a column sum do not fit), but not within the tuner's 8 KiB headroom
    assert not fits_smem(dataclasses.replace(c3, num_stages=3), torch.bfloat16, H200)
    assert fits_smem(pp(4, CONSUMERS=3), torch.bfloat16, H200)  # slices from registers, 5 stages
    with pytest.raises(ValueError, match="must be one of"):
        pp(4, CONSUMERS=4)
    with pytest.raises(ValueError, match="CONSUMERS=3 is the ping-pong schedule's"):
        GemmConfig("pingpong", 128, 256, 64, 8, 1, 4, 3, (("EPI_WG", 2), ("CONSUMERS", 3)))
    with pytest.raises(ValueError, match="CONSUMERS only applies"):
        GemmConfig("persistent_tma", 128, 256, 64, 8, 1, 8, 3, (("CONSUMERS", 3),))
    fell = resolve_config(torch.randn(64, 32), torch.randn(32, 64), c3)
    assert fell.template == "persistent_tma" and dict(fell.extra) == {"EPILOGUE_SUBTILE": 4, "PREFETCH": 0}


def test_two_warpgroup_consumers_config_rules():
    """num_warps: 4 (a consumer is one warpgroup) or 8 (two warpgroups, 64 rows each: BLOCK_M 128), the ping-pong
    pair only (not three consumers, not the EPI_WG schedule); launched under MAXNREG8, which leaves each consumer
    CONSUMER_REGS8 registers beside the loader's warpgroup; the fallback to persistent_tma keeps the warps."""
    w8 = GemmConfig("pingpong", 128, 128, 64, 8, 1, 8, 4, (("EPILOGUE_SUBTILE", 4), ("EPI_TMA", True)))
    assert w8.short() == "pingpong_128x128x64_g8_w8_s4_epilogue_subtile4_epi_tma"
    assert w8.smem_bytes(2) == dataclasses.replace(w8, num_warps=4).smem_bytes(2)
    with pytest.raises(ValueError, match="must be 4 or 8"):
        GemmConfig("pingpong", 128, 128, 64, 8, 1, 2, 4)
    with pytest.raises(ValueError, match="needs BLOCK_M == 128"):
        GemmConfig("pingpong", 64, 128, 64, 8, 1, 8, 4)
    with pytest.raises(ValueError, match="needs BLOCK_M == 128"):
        GemmConfig("pingpong", 128, 128, 64, 8, 1, 8, 4, (("CONSUMERS", 3),))
    with pytest.raises(ValueError, match="needs BLOCK_M == 128"):
        GemmConfig("pingpong", 128, 256, 64, 8, 1, 8, 3, (("EPI_WG", 2),))
    assert gluon_template.launch_maxnreg(0, 2, 8) == gluon_template.MAXNREG8
    assert gluon_template.launch_maxnreg(0, 2, 4) == gluon_template.MAXNREG
    # Triton's warp-group allocation: launch cap x (8 + 8 + 4 padded loader warps) x 32 covers the consumers'
    # and the loader's setmaxnreg, and the cap fits 64K registers
    assert gluon_template.MAXNREG8 * 20 * 32 <= 65536
    assert (2 * 8 * gluon_template.CONSUMER_REGS8 + 4 * gluon_template.LOADER_REGS) * 32 <= \
        gluon_template.MAXNREG8 * 20 * 32
    fell = resolve_config(torch.randn(64, 32), torch.randn(32, 64), w8)
    assert fell.template == "persistent_tma" and fell.num_warps == 8


def test_candidates_offer_pingpong_only_where_it_runs():
    cands = candidate_configs(8192, 4096, 1024, torch.bfloat16, H200, tma_ok=True)
    templates = [c.template for c in cands[:5]]
    assert templates.count("pingpong") == (3 if gluon_template.available() else 0)
    for dtype, kw in ((torch.float32, dict(allow_tf32=True)), (torch.float16, dict(tma_ok=False))):
        others = candidate_configs(8192, 4096, 1024, dtype, H200, **{"tma_ok": True, **kw})
        assert "pingpong" not in {c.template for c in others}
    # an epilogue without the loader's one 16-bit M x N input (mixed_dag: two) loses the EPI_TMA candidate, and
    # the epilogue loop from shared memory (halves, one shared buffer, 4 stages) moves into the first five
    if gluon_template.available():
        with_tma = for_epilogue(cands, tma_input=True, tile_inputs=1)
        without = for_epilogue(cands, tma_input=False, tile_inputs=2)
        assert with_tma == cands and any(c.flag("EPI_TMA") for c in cands[:5])
        assert not any(c.flag("EPI_TMA") for c in without) and len(without) == len(cands) - 2
        loop = dataclasses.replace(pp(2, EPI_SMEM=1), num_stages=4)
        assert loop in without[:5] and loop not in with_tma[:5] and loop in with_tma
        # a short K loop (K = 1024): the halves with a sixth ring stage right after the halves, then consumers of
        # two warpgroups, which take ping-pong halves without prefetch's place in the first five; a long one
        # (K = 4096): no deep ring, and the two-warpgroup consumers come last of the ping-pong configs
        wide = GemmConfig("pingpong", 128, 128, 64, 8, 1, 8, 4, (("EPILOGUE_SUBTILE", 4), ("EPI_TMA", True)))
        deep = dataclasses.replace(pp(2), num_stages=DEEP_RING_STAGES)
        # the heuristic (ping-pong halves, policy.heuristic_choice) first, the 128x256 persistent kernel second
        assert cands[0] == pp(2) and cands[1].template == "persistent_tma" and cands[1].BLOCK_N == 256
        assert cands[2] == deep and cands[4] == wide and pp(2, PREFETCH=0) not in cands[:5]
        assert pp(4, PREFETCH=0) in without[:6] and pp(2, PREFETCH=0) in without[6:]
        long_k = candidate_configs(8192, 4096, 4096, torch.bfloat16, H200, tma_ok=True)
        assert long_k[2] == pp(2, PREFETCH=0) and wide in long_k[5:] and deep not in long_k
        # an epilogue with no M x N input converts its ping-pong configs from registers to the wgmma layout with
        # TMA stores; the deep ring keeps its six stages there on the fewest slices whose output buffers fit
        # beside them (one output: halves; two: quarters), and stays as it is where even quarters do not fit
        for outputs, slices in ((1, 2), (2, 4), (3, None)):
            for info in (H200, None):
                got = for_epilogue(cands, tma_input=False, tma_outputs=outputs, dtype=torch.bfloat16, info=info)
                (deep_got,) = [c for c in got if c.num_stages == DEEP_RING_STAGES]
                assert got.index(deep_got) == cands.index(deep), (outputs, got)
                if slices is None:
                    assert deep_got == deep
                else:
                    assert deep_got == dataclasses.replace(pp(slices, EPI_MMA=True, TMA_STORE=outputs),
                                                           num_stages=DEEP_RING_STAGES)
                    assert fits_smem(deep_got, torch.bfloat16, H200)
                    assert not fits_smem(dataclasses.replace(deep_got, extra=tuple(
                        dict(deep_got.extra, EPILOGUE_SUBTILE=slices // 2).items())), torch.bfloat16, H200)
        assert [c for c in long_k if c.template == "pingpong"][-1] == wide
        assert pp(4, PREFETCH=0) in for_epilogue(long_k, tma_input=False, tile_inputs=2)[5:]
        # an epilogue that stores no M x N tile (a loss) runs its EPI_TMA configs in the wgmma layout, in place, on
        # a fifth ring stage (no conversion scratch: MMA_TMA_STAGES fit beside the input slices with 2 KiB left)
        mma = for_epilogue(cands, tma_input=True, tile_stores=False)
        assert len(mma) == len(cands) and [c.flag("EPI_MMA") for c in mma] == [c.flag("EPI_TMA") for c in cands]
        assert [c.num_stages == MMA_TMA_STAGES for c in mma if c.flag("EPI_MMA")] == [True, True]
        assert [dataclasses.replace(c, extra=tuple(x for x in c.extra if x[0] != "EPI_MMA"),
                                    num_stages=c.num_stages if not c.flag("EPI_MMA") else d.num_stages)
                for c, d in zip(mma, cands)] == cands
        assert for_epilogue(cands, tma_input=True, tile_stores=False, dtype=torch.bfloat16, info=H200) == mma
        assert all(fits_smem(c, torch.bfloat16, H200) for c in mma)
        # the headroom: five stages with the input slices fit in the wgmma layout, not with a conversion's scratch
        assert fits_smem(pp(2, EPI_TMA=True, EPI_MMA=True), torch.bfloat16, H200)
        assert not fits_smem(pp(2, EPI_TMA=True), torch.bfloat16, H200)
        assert for_epilogue(cands, tma_input=False, tile_stores=False, tile_inputs=2) == without
        # an epilogue that reduces drops the persistent flattened loop on halves (several times slower with a
        # reduction on an H100), and only that config: quarters keep the flattened loop
        flat_halves = GemmConfig("persistent_tma", 128, 256, 64, 8, 1, 8, 3,
                                 (("EPILOGUE_SUBTILE", True), ("FLATTEN", True)))
        flat_quarters = dataclasses.replace(flat_halves, extra=(("EPILOGUE_SUBTILE", 4), ("FLATTEN", True)))
        assert flat_halves in cands and flat_quarters in cands
        reducing = for_epilogue(cands, tma_input=True, tile_inputs=1, reductions=True)
        assert reducing == [c for c in with_tma if c != flat_halves]
        # an epilogue whose tile outputs TMA stores: its EPI_TMA configs also store them by TMA (in place); with no
        # M x N input at all, every ping-pong config from registers runs so (EPI_TMA dropped; the deep ring too, on
        # quarters for two outputs), with stages cut
        # where the output buffers would not fit, and PREFETCH dropped (nothing to prefetch: a config and its
        # PREFETCH=0 twin are one kernel, timed once); an epilogue loading inputs itself keeps the blocked layout
        ts = for_epilogue(cands, tma_input=True, tma_outputs=1, tile_inputs=1, dtype=torch.bfloat16, info=H200)
        assert [c.flag("TMA_STORE") for c in ts] == [c.flag("EPI_TMA") * 1 for c in cands]
        assert [c.flag("EPI_MMA") for c in ts] == [c.flag("EPI_TMA") for c in cands]
        none_in = for_epilogue(cands, tma_input=False, tma_outputs=2, dtype=torch.bfloat16, info=H200)
        for c in none_in:
            plain = c.template == "pingpong" and not (c.flag("EPI_SMEM") or c.flag("EPI_LOOP"))
            assert not c.flag("EPI_TMA") and c.flag("TMA_STORE") == (2 if plain else 0) and c.flag("EPI_MMA") == plain
            assert not c.flag("PREFETCH", None) and fits_smem(c, torch.bfloat16, H200)
        assert len(none_in) == len(set(none_in)) < len(cands)  # the PREFETCH=0 twins merged
        assert any(c.flag("PREFETCH", None) == 0 for c in cands)
        # the wgmma layout's 2 KiB headroom fits the halves' five stages beside two outputs' TMA buffers
        assert pp(2, EPI_MMA=True, TMA_STORE=2) in none_in[:3]
        two_in = for_epilogue(cands, tma_input=False, tma_outputs=2, tile_inputs=2, dtype=torch.bfloat16, info=H200)
        assert two_in == without
    A100 = DeviceInfo("cuda", "A100", (8, 0), 108, 166912)
    assert "pingpong" not in {c.template for c in candidate_configs(8192, 4096, 1024, torch.bfloat16, A100,
                                                                    tma_ok=True)}


def test_many_tma_outputs_keep_valid_configs():
    """An epilogue without M x N inputs and with many TMA-storable tile outputs (the selftest's op_pow: six): a
    conversion whose output buffers do not fit beside even two ring stages leaves the config from registers as
    it was (and drops the EPI_TMA config, which without its input would be a near-copy of halves) instead of
    cutting BLOCK_K below the ping-pong template's 64 (a ValueError on every such call before 2026-11-27);
    everything offered fits and, where the tuner keeps converting, stores by TMA. Two lists: the selftest's size
    (1024x768x512: less than a wave of 128x128 tiles, so the few-rows tiles come first and two ping-pong configs
    are left in the first 16) and a wave or more (4096x4096x512: every ping-pong config, quarters included)."""
    for shape in ((1024, 768, 512), (4096, 4096, 512)):
        cands = candidate_configs(*shape, torch.bfloat16, H200, tma_ok=True)
        quarters = any(c.template == "pingpong" and c.epilogue_subtiles == 4 and not c.flag("EPI_TMA")
                       for c in cands)
        assert quarters == (shape[0] == 4096)
        for outputs in range(1, 9):
            got = for_epilogue(cands, tma_input=False, tma_outputs=outputs, dtype=torch.bfloat16, info=H200)
            assert all(fits_smem(c, torch.bfloat16, H200) and c.BLOCK_K == 64
                       for c in got if c.template == "pingpong")
            assert not any(c.flag("EPI_TMA") for c in got)
            assert all(c.flag("TMA_STORE") == outputs for c in got if c.flag("EPI_MMA"))
            if outputs >= 6:  # six halves' buffers (192 KiB) leave no room for two stages: halves stay as they were
                assert pp(2) in got
                if quarters:  # quarters still convert
                    assert any(c.flag("EPI_MMA") and c.epilogue_subtiles == 4 for c in got)


@settings(max_examples=200, deadline=None)
@given(M=st.sampled_from([128, 1000, 4096, 8192]), N=st.sampled_from([128, 776, 4096, 8192]),
       K=st.sampled_from([64, 1024, 4096]), dtype=st.sampled_from([torch.float16, torch.bfloat16]),
       tma_input=st.booleans(), tile_stores=st.booleans(), tma_outputs=st.integers(0, 8),
       tile_inputs=st.integers(0, 3), reductions=st.booleans(), info=st.sampled_from([H200, None]))
def test_for_epilogue_offers_only_valid_configs(M, N, K, dtype, tma_input, tile_stores, tma_outputs, tile_inputs,
                                                reductions, info):
    """Whatever the epilogue (its input through the loader or not, tile stores, TMA-storable outputs, inputs it
    loads itself, reductions) and the shape, ``for_epilogue`` returns configs that construct, fit Hopper's shared
    memory, keep a ping-pong BLOCK_K of 64, store by TMA only as many outputs as there are, take the loader's
    input only where there is one, and repeat none; at least one candidate is left."""
    tile_inputs = max(tile_inputs, int(tma_input))  # the loader's input is one of the epilogue's M x N inputs
    cands = candidate_configs(M, N, K, dtype, H200, tma_ok=True)
    got = for_epilogue(cands, tma_input=tma_input, tile_stores=tile_stores, tma_outputs=tma_outputs,
                       tile_inputs=tile_inputs, reductions=reductions, dtype=dtype, info=info)
    assert got and len(got) == len(set(got))
    for c in got:
        assert fits_smem(c, dtype, H200), c
        if c.template == "pingpong":
            assert c.BLOCK_K == 64, c
            assert c.flag("TMA_STORE") in (0, tma_outputs if tile_stores else 0), c
            assert not c.flag("EPI_TMA") or tma_input, c


def test_render_validates_and_names_partitions():
    text = gluon_template.render_pingpong("k", "epi", ["in_C", "s_C_M"], prefetch=1)
    for name in ("def k(", "def k_load(", "def k_consume(", "def k_consume0(", "def k_consume1(", "epi_prefetch(",
                 "epi_pf(", "gl.warp_specialize("):
        assert name in text
    assert "epi_prefetch" not in gluon_template.render_pingpong("k", "epi", ["in_C"], prefetch=0)
    tma = gluon_template.render_pingpong("k", "epi", ["in_C", "s_C_M"], prefetch=1, tma_input=("in_C", "s_C_M"))
    assert "tma.make_tensor_descriptor(in_C, shape=[M, N], strides=[s_C_M, 1]" in tma and "c_ready.index(" in tma
    assert "tma_load(c_desc" not in text and "tma_load(c_desc" in tma
    with pytest.raises(ValueError, match="exactly one prefetched"):
        gluon_template.render_pingpong("k", "epi", ["in_C", "s_C_M"], prefetch=2, tma_input=("in_C", "s_C_M"))
    with pytest.raises(ValueError, match="kernel_name"):
        gluon_template.render_pingpong("1k", "epi", [])
    with pytest.raises(ValueError, match="prefetch"):
        gluon_template.render_pingpong("k", "epi", [], prefetch=-1)
    budget = 128 * (2 * gluon_template.CONSUMER_REGS + gluon_template.LOADER_REGS)
    assert budget <= 65536 and gluon_template.MAXNREG * 384 <= 65536
    # the epilogue-warpgroup schedule: an epilogue partition fed from the hand-off ring, an MMA partition that
    # issues its own TMA copies; 12 warps at the launch cap, the MMA warpgroups at MMA_REGS
    for name in ("def k_epi(", "def k_mma(", "def k_issue(", "acc_bufs.index(q % EPI_WG).store(acc_s3)",
                 "acc_bufs.index(q % EPI_WG).load(epi_layout)", "], [8], [" + str(gluon_template.MMA_REGS) + "])"):
        assert name in text, name
    assert gluon_template.MAXNREG_WG * 384 <= 65536 and gluon_template.MMA_REGS <= gluon_template.MAXNREG_WG
    # EPI_SMEM: the accumulator's slices stored once, one runtime loop over them calling the epilogue once, the
    # next slice's prefetch bounded to nothing after the last slice
    for name in ("acc_bufs.index(ebase + 3).store(acc_s3)", "elif h == 1:\n", "acc_bufs.index(ebase + 1).store(acc_s3)",
                 "for h in range(EPI_SMEM):", "for s2 in range(EPILOGUE_SUBTILE // EPI_SMEM):",
                 "acc_e = acc_bufs.index(ebase + s2).load(epi_layout)", "M * (s + 1 < EPILOGUE_SUBTILE)",
                 "mbarrier.arrive(acc_empty.index(ebuf), count=1)",
                 "mbarrier.wait(acc_empty.index(ebuf), ((q // (CONSUMERS - 1)) & 1) ^ 1)"):
        assert name in text, name
    # CONSUMERS = 3: a third consumer partition, launched at 16 warps under MAXNREG3; each consumer's main loop
    # waits for the previous consumer's (cyclically)
    for name in ("def k_consume2(", "], [4, 4, 1], [160, 160, " + str(gluon_template.LOADER_REGS) + "])",
                 "mbarrier.arrive(turn.index((WHICH + 1) % CONSUMERS), count=1)",
                 "range(start_pid + WHICH * NUM_PROGRAMS, num_tiles, CONSUMERS * NUM_PROGRAMS)"):
        assert name in text, name
    assert (3 * 128 * gluon_template.CONSUMER_REGS3 + 128 * gluon_template.LOADER_REGS <= 65536
            and gluon_template.MAXNREG3 * 512 <= 65536)
    assert [gluon_template.launch_maxnreg(w, c) for w, c in ((0, 2), (0, 3), (2, 2))] == [
        gluon_template.MAXNREG, gluon_template.MAXNREG3, gluon_template.MAXNREG_WG]
    loop = text.split("if EPI_SMEM > 0:")[1].split("\n        elif EPI_LOOP:\n")[0]
    # one call per slice of an iteration: two slices per iteration where each buffer fill has an even count (the
    # two input register sets alternate, no carried copy), else one with the copy, and one without prefetch
    assert loop.count("epi_pf(") == 3 and loop.count("epi(") == 1
    pairs = loop.split("for s2 in range(0, EPILOGUE_SUBTILE // EPI_SMEM, 2):")[1].split("elif PREFETCH > 0:")[0]
    assert "pf1_0 = epi_prefetch(" in pairs and "pf0_0 = epi_prefetch(" in pairs and " = pf1_0" not in pairs
    assert pairs.index("s_C_M, pf0_0)") < pairs.index("pf0_0 = epi_prefetch(") < pairs.index("s_C_M, pf1_0)")
    # the loop alone takes eighths: the split into acc_s0 .. acc_s7 (column order, by halving) and their stores
    for name in ("if EPILOGUE_SUBTILE == 8:", "acc_bufs.index(ebase + 7).store(acc_s7)",
                 "acc_bufs.index(ebase + 3).store(acc_s7)", "gl.reshape(acc_h4_3, (BLOCK_M, 2, BLOCK_N // 8))"):
        assert name in loop, name
    assert text.count("EPILOGUE_SUBTILE == 8") == 2  # the loop's split and its stores, no unrolled eighths
    # EPI_LOOP: one runtime loop over the slices in registers, each iteration taking acc_s0 and shifting the rest
    # down; one epilogue call per path (prefetched, plain), the next slice's inputs carried into the next iteration
    reg = text.split("\n        elif EPI_LOOP:\n")[1].split("\n        else:\n")[0]
    for name in ("for s in range(EPILOGUE_SUBTILE):", "acc_e = gl.convert_layout(acc_s0, epi_layout)",
                 "acc_s0, acc_s1, acc_s2, acc_s3 = acc_s1, acc_s2, acc_s3, acc_s3", "acc_s0, acc_s1 = acc_s1, acc_s1",
                 "pf1_0 = epi_prefetch(offs_m, offs_n + (s + 1) * EPI_N, 0, M * (s + 1 < EPILOGUE_SUBTILE)",
                 "pf0_0 = pf1_0"):
        assert name in reg, name
    assert reg.count("epi_pf(") == 2 and reg.count("epi(") == 2 and "c_ready" not in reg
    reg_tma = tma.split("\n        elif EPI_LOOP:\n")[1].split("\n        else:\n")[0]
    assert "mbarrier.wait(c_ready.index(WHICH * EPILOGUE_SUBTILE + s), j & 1)" in reg_tma


@pytest.mark.parametrize("name", ["mixed_dag", "row_reduction", "bce_loss"])
def test_falls_back_to_persistent_off_hopper(name):
    """Under the interpreter (no Hopper, no Gluon execution) a ping-pong config runs the persistent TMA template
    with the same tile and sub-tiling: same results, outputs poisoned."""
    ex = EXAMPLES[name]
    M, N, K = 70, 136, 48
    A, B = torch.randn(M, K), torch.randn(K, N)
    assert resolve_config(A, B, pp(4, EPI_TMA=True)).template == "persistent_tma"
    assert resolve_config(A, B, pp(4)).template == "persistent_tma"
    assert resolve_config(A, B, pp(4)).epilogue_subtiles == 4
    kw = ex.make_inputs(M, N, "cpu", torch.float32)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EVTORCH_POISON", "1")
        out = evt.gemm(A, B, ex.fn, backend="triton", config=pp(4), **kw)
    ref = eager_reference(ex.fn, A, B, **kw)
    out = out if isinstance(out, tuple) else (out,)
    ref = ref if isinstance(ref, tuple) else (ref,)
    for o, r in zip(out, ref):
        torch.testing.assert_close(o, r, rtol=1e-4, atol=1e-4)


def test_offline_compile_specialises_unit_strides_as_a_launch_does():
    """fastmath_offline compiles the innermost stride of every epilogue tensor as the constant 1 (Triton's launch
    specialisation on contiguous tensors, which is what vectorizes the epilogue's loads and stores): its register
    and instruction counts are those of the launched kernel only with these."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.fastmath_offline import unit_strides
    from benchmarks.pingpong_check import workload
    from evtorch.api import get_epilogue
    from evtorch.codegen.program import build_program

    fn, mk = workload("mixed_dag")
    inputs = mk(256, 512, "cpu", torch.bfloat16)
    ep = get_epilogue(fn, (256, 512), torch.float32, inputs)
    prog = build_program(ep, out_dtype=torch.bfloat16, fast_math="never", deterministic=True)
    # M x N inputs and outputs along N, the (M,) bias along M, the (N,) bias along N, the partials buffers
    # [T, kept] along the kept axis; never an M stride of a 2-D tensor or a buffer's tile stride
    assert sorted(unit_strides(prog.epilogue.params)) == ["rs0_N", "rs1_M", "s_C_N", "s_aux_N", "s_cbias_M",
                                                          "s_rbias_N", "so0_N", "so1_N"]


@needs_gluon
@pytest.mark.parametrize("config,workloads", [("pp_q4", "identity,colbcast_leaky,rowreduce_tanh"),
                                              ("pp_h_p0", "mixed_dag,bce_loss"),
                                              ("pp_h_tma", "lincomb_relu,dgelu_bgrad"),
                                              ("wg_q4", "identity,bias_gelu_aux,rowreduce_tanh"),
                                              ("wg_q4_s2r3", "mixed_dag,bce_loss"),
                                              ("pp_es1_q4", "bce_loss,colbcast_leaky,dgelu_bgrad"),
                                              ("pp_es2_h", "mixed_dag,rowreduce_tanh,bias_gelu_aux"),
                                              ("pp_es1_s8", "bce_loss,mixed_dag,rowreduce_tanh"),
                                              ("pp_es2_s8", "dgelu_bgrad,colbcast_leaky"),
                                              ("pp3_es1_q4_p0", "bce_loss,mixed_dag,rowreduce_tanh"),
                                              ("pp3_q4_p0", "lincomb_relu,dgelu_bgrad"),
                                              ("pp8_q4_tma", "bce_loss,colbcast_leaky,dgelu_bgrad"),
                                              ("pp8_es1_q4", "mixed_dag,rowreduce_tanh"),
                                              ("pp8_h", "identity,bias_gelu_aux"),
                                              ("pp_el_q4", "bce_loss,mixed_dag,rowreduce_tanh"),
                                              ("pp_el_h_tma", "lincomb_relu,colbcast_leaky"),
                                              ("pp8_el_q4_tma", "dgelu_bgrad,bias_gelu_aux"),
                                              ("pp_mma_h_tma", "bce_loss,rowreduce_tanh"),
                                              ("pp_mma_q4", "identity,mixed_dag,dgelu_bgrad"),
                                              ("pp_mma_ts_h_tma", "colbcast_leaky,rowreduce_tanh,bce_loss"),
                                              ("pp_ts_h", "bias_gelu_aux,mixed_dag,identity"),
                                              ("pp_mma_ts_q4", "dgelu_bgrad,lincomb_relu"),
                                              ("pp_h_s6", "bias_gelu_aux,mixed_dag,rowreduce_tanh")])
def test_compiles_for_sm90(tmp_path, config, workloads):
    """Every kind of epilogue (stores, broadcasts, prefetched input, row / column / full reductions, two inputs)
    compiles for sm_90 with the installed Triton, within the shared memory of one SM."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["EVTORCH_CACHE_DIR"] = str(tmp_path / "cache")
    out = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.fastmath_offline", "--workloads", workloads,
                           "--config", config, "--modes", "auto", "--json", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and out.exists(), proc.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert [r["workload"] for r in rows] == workloads.split(",")
    for r in rows:
        cap = (gluon_template.MAXNREG_WG if config.startswith("wg_") else
               gluon_template.MAXNREG3 if config.startswith("pp3_") else
               gluon_template.MAXNREG8 if config.startswith("pp8_") else gluon_template.MAXNREG)
        assert r["regs"] == cap and 0 < r["shared"] <= H200.smem_bytes, r
        assert r["instructions"] > 1000

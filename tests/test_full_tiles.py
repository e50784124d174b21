"""The launch's specialisations of the epilogue (``codegen.epilogue.LAUNCH_FLAGS``).

Whole tiles: when M (N) is a multiple of the tile height (width), the launcher sets EVEN_M (EVEN_N) and the
epilogue's bounds masks become constant true, which Triton folds away. Checked here: the flags the launcher derives
from the shape and the config; results for every combination of whole and ragged axes under each template the
interpreter runs, with row, column and full reductions (where a mask that is wrongly dropped would let padding into
a sum or a max) in both reduction modes and outputs poisoned; and, offline for sm_90, that the whole-tile kernel is
the smaller one (the masks really fold) and that the ragged kernel still compiles.

Index width: element offsets along M and N are int32 (INDEX_DTYPE) where every epilogue tensor's offsets fit, else
int64. Checked: the rule on strides near the limit, and results with the int64 offsets forced.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import triton.language as tl

import evtorch as evt
import evtorch.runtime.gemm as rg
from evtorch.api import get_epilogue
from evtorch.codegen.configs import GemmConfig
from evtorch.codegen.program import build_program
from evtorch.runtime.gemm_launch import prepare_launch, resolve_config

ROOT = Path(__file__).resolve().parents[1]

# 16 x 32 tiles; every N is a multiple of 4 so that B's fp32 rows are 16-byte aligned and persistent_tma runs
# (not its portable fallback). (M, N): whole x whole, whole x ragged, ragged x whole, ragged x ragged.
SHAPES = [(32, 64), (32, 52), (40, 64), (40, 52)]
K = 24  # ragged along K (16-deep steps); the pointer templates' EVEN_K is checked with K = 32 too
CONFIGS = {
    "portable": GemmConfig("portable", 16, 32, 16, 2, 1, 4, 1),
    "splitk": GemmConfig("splitk", 16, 32, 16, 2, 2, 4, 1),
    "persistent_tma": GemmConfig("persistent_tma", 16, 32, 16, 2, 1, 4, 1,
                                 (("EPILOGUE_SUBTILE", 2), ("PREFETCH", 1))),
}


def epilogue(acc, C, r, c):
    z = torch.tanh(acc * r[:, None] + C) - c
    return z, z.sum(dim=1), z.amax(dim=0), (z * z).sum()


def _inputs(M, N, seed=0, K=K):
    g = torch.Generator().manual_seed(seed)
    A, B = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    kw = dict(C=torch.randn(M, N, generator=g), r=torch.randn(M, generator=g), c=torch.randn(N, generator=g))
    return A, B, kw


@pytest.mark.parametrize("template", sorted(CONFIGS))
@pytest.mark.parametrize("M,N", SHAPES, ids=[f"{m}x{n}" for m, n in SHAPES])
@pytest.mark.parametrize("k", [24, 32])
def test_launcher_sets_even_flags_from_shape_and_tile(template, M, N, k):
    A, B, kw = _inputs(M, N, K=k)
    ep = get_epilogue(epilogue, (M, N), torch.float32, kw)
    prog = build_program(ep, out_dtype=torch.float32)
    config = CONFIGS[template]
    assert resolve_config(A, B, config).template == template
    launch = prepare_launch(prog.module, prog.kernel_base, A, B, config, allow_tf32=False)
    assert launch.common["EVEN_M"] is (M % 16 == 0) and launch.common["EVEN_N"] is (N % 32 == 0)
    assert launch.common["INDEX_DTYPE"] == tl.int64  # until a caller that knows the epilogue's tensors narrows it
    # the pointer templates' own K loop (persistent_tma's TMA loads need no mask)
    assert launch.common.get("EVEN_K") == (None if template == "persistent_tma" else k % 16 == 0)
    if template == "splitk":  # the reduce kernel runs the epilogue: it gets the same flags
        assert (launch.reduce_kwargs["EVEN_M"], launch.reduce_kwargs["EVEN_N"]) == (M % 16 == 0, N % 32 == 0)


@pytest.mark.interpreter
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "partials"])
@pytest.mark.parametrize("template", sorted(CONFIGS))
@pytest.mark.parametrize("M,N", SHAPES, ids=[f"{m}x{n}" for m, n in SHAPES])
@pytest.mark.parametrize("k", [24, 32])
def test_whole_and_ragged_tiles_match_eager(template, M, N, k, deterministic, monkeypatch):
    monkeypatch.setenv("EVTORCH_POISON", "1")
    A, B, kw = _inputs(M, N, seed=M * N, K=k)
    rg.clear_caches()
    out = evt.gemm(A, B, epilogue, backend="triton", config=CONFIGS[template], deterministic=deterministic, **kw)
    assert {launch.gemm.common["INDEX_DTYPE"] for launch in rg._launches.values()} == {tl.int32}
    ref = epilogue(A.double() @ B.double(), **{k: v.double() for k, v in kw.items()})
    for o, r in zip(out, ref):
        assert not torch.isnan(o).any()
        torch.testing.assert_close(o.double(), r, rtol=1e-5, atol=1e-4)


def _offline(tmp_path, config: str, workloads: str, ragged: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["EVTORCH_CACHE_DIR"] = str(tmp_path / "cache")
    out = tmp_path / f"{config}_{'ragged' if ragged else 'even'}.json"
    cmd = [sys.executable, "-m", "benchmarks.fastmath_offline", "--workloads", workloads, "--config", config,
           "--modes", "auto", "--json", str(out)] + (["--ragged"] if ragged else [])
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and out.exists(), proc.stderr[-3000:]
    return {r["workload"]: r for r in json.loads(out.read_text())}


@pytest.mark.parametrize("config", ["pp_mma_ts_h_tma", "base"])
def test_whole_tile_kernel_drops_the_mask_instructions(tmp_path, config):
    """sm_90 SASS (Triton's bundled ptxas, no GPU): with EVEN_M and EVEN_N the kernel of an epilogue with a row
    reduction and two column amaxes has fewer instructions than the ragged one, which compiles too."""
    from evtorch.codegen import gluon_template

    if config.startswith("pp") and not gluon_template.available():
        pytest.skip("the installed Triton has no Gluon Hopper API")
    workloads = "rowreduce_tanh,mixed_dag"
    even, ragged = _offline(tmp_path, config, workloads, False), _offline(tmp_path, config, workloads, True)
    for name in workloads.split(","):
        assert even[name]["even"] and not ragged[name]["even"]
        assert even[name]["instructions"] < ragged[name]["instructions"], (name, even[name], ragged[name])


class _Call:
    """What ``rg._offsets_fit_int32`` reads of a call: sizes and the resolved stride parameters."""

    def __init__(self, M, N, strides):
        self.sizes, self.strides = {"M": M, "N": N, "L": 1}, strides

    def resolve(self, p):
        return self.strides[p.name]


def test_index_width_rule():
    """int32 offsets only while every tensor's offsets along M and N, over the tiles' padded reach (two tiles per
    axis), stay below 2^31; batch (L) and workspace-slot (T) strides never count (those offsets are int64)."""
    from evtorch.codegen.params import Param

    cfg = GemmConfig("portable", 64, 128, 32, 8, 1, 4, 3)
    params = [Param("s_C_M", "in_stride", ("C", "MN", "M")), Param("s_C_N", "in_stride", ("C", "MN", "N")),
              Param("so0_M", "out_stride", (0, "M")), Param("so0_N", "out_stride", (0, "N")),
              Param("so0_L", "out_stride", (0, "L")), Param("rs0_T", "buf_stride", (0, "T"))]
    M, N = 4096, 8192
    reach_m, reach_n = M + 2 * 64, N + 2 * 128
    base = {"s_C_M": N, "s_C_N": 1, "so0_M": N, "so0_N": 1, "so0_L": 2 ** 40, "rs0_T": 2 ** 40}
    assert rg._offsets_fit_int32(params, _Call(M, N, base), cfg)
    # one tensor's M stride such that its reach along M alone is the limit: int64
    s_m = (2 ** 31 - (reach_n - 1)) // reach_m + 1
    assert not rg._offsets_fit_int32(params, _Call(M, N, {**base, "so0_M": s_m}), cfg)
    assert rg._offsets_fit_int32(params, _Call(M, N, {**base, "so0_M": (2 ** 31 - reach_n) // reach_m}), cfg)
    # transposed views count their strides whichever axis they are on; broadcast (0) strides count nothing
    assert not rg._offsets_fit_int32(params, _Call(M, N, {**base, "s_C_M": 0, "s_C_N": 2 ** 31 // reach_n + 1}), cfg)


@pytest.mark.interpreter
@pytest.mark.parametrize("template", sorted(CONFIGS))
def test_int64_offsets_match_eager(template, monkeypatch):
    """The int64 path (taken by tensors of 2^31 elements or more, too big for a CPU test) on small tensors: the
    limit is lowered so that no launch narrows its offsets."""
    monkeypatch.setenv("EVTORCH_POISON", "1")
    monkeypatch.setattr(rg, "_INT32_LIMIT", 1)
    rg.clear_caches()
    try:
        A, B, kw = _inputs(40, 52, seed=7)
        out = evt.gemm(A, B, epilogue, backend="triton", config=CONFIGS[template], **kw)
        assert {launch.gemm.common["INDEX_DTYPE"] for launch in rg._launches.values()} == {tl.int64}
        ref = epilogue(A.double() @ B.double(), **{k: v.double() for k, v in kw.items()})
        for o, r in zip(out, ref):
            torch.testing.assert_close(o.double(), r, rtol=1e-5, atol=1e-4)
    finally:
        rg.clear_caches()

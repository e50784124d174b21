"""Whole tiles: when M (N) is a multiple of the tile height (width), the launcher sets EVEN_M (EVEN_N) and the
epilogue's bounds masks become constant true, which Triton folds away (``codegen.epilogue``).

Checked here: the flags the launcher derives from the shape and the config; results for every combination of
whole and ragged axes under each template the interpreter runs, with row, column and full reductions (where a
mask that is wrongly dropped would let padding into a sum or a max) in both reduction modes and outputs poisoned;
and, offline for sm_90, that the whole-tile kernel is the smaller one (the masks really fold) and that the
ragged kernel still compiles.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import evtorch as evt
from evtorch.api import get_epilogue
from evtorch.codegen.configs import GemmConfig
from evtorch.codegen.program import KERNEL_BASE, build_program
from evtorch.runtime.gemm_launch import prepare_launch, resolve_config

ROOT = Path(__file__).resolve().parents[1]

# 16 x 32 tiles; every N is a multiple of 4 so that B's fp32 rows are 16-byte aligned and persistent_tma runs
# (not its portable fallback). (M, N): whole x whole, whole x ragged, ragged x whole, ragged x ragged.
SHAPES = [(32, 64), (32, 52), (40, 64), (40, 52)]
K = 24
CONFIGS = {
    "portable": GemmConfig("portable", 16, 32, 16, 2, 1, 4, 1),
    "splitk": GemmConfig("splitk", 16, 32, 16, 2, 2, 4, 1),
    "persistent_tma": GemmConfig("persistent_tma", 16, 32, 16, 2, 1, 4, 1,
                                 (("EPILOGUE_SUBTILE", 2), ("PREFETCH", 1))),
}


def epilogue(acc, C, r, c):
    z = torch.tanh(acc * r[:, None] + C) - c
    return z, z.sum(dim=1), z.amax(dim=0), (z * z).sum()


def _inputs(M, N, seed=0):
    g = torch.Generator().manual_seed(seed)
    A, B = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    kw = dict(C=torch.randn(M, N, generator=g), r=torch.randn(M, generator=g), c=torch.randn(N, generator=g))
    return A, B, kw


@pytest.mark.parametrize("template", sorted(CONFIGS))
@pytest.mark.parametrize("M,N", SHAPES, ids=[f"{m}x{n}" for m, n in SHAPES])
def test_launcher_sets_even_flags_from_shape_and_tile(template, M, N):
    A, B, kw = _inputs(M, N)
    ep = get_epilogue(epilogue, (M, N), torch.float32, kw)
    prog = build_program(ep, out_dtype=torch.float32)
    config = CONFIGS[template]
    assert resolve_config(A, B, config).template == template
    launch = prepare_launch(prog.module, KERNEL_BASE, A, B, config, allow_tf32=False)
    assert launch.common["EVEN_M"] is (M % 16 == 0) and launch.common["EVEN_N"] is (N % 32 == 0)
    if template == "splitk":  # the reduce kernel runs the epilogue: it gets the same flags
        assert (launch.reduce_kwargs["EVEN_M"], launch.reduce_kwargs["EVEN_N"]) == (M % 16 == 0, N % 32 == 0)


@pytest.mark.interpreter
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "partials"])
@pytest.mark.parametrize("template", sorted(CONFIGS))
@pytest.mark.parametrize("M,N", SHAPES, ids=[f"{m}x{n}" for m, n in SHAPES])
def test_whole_and_ragged_tiles_match_eager(template, M, N, deterministic, monkeypatch):
    monkeypatch.setenv("EVTORCH_POISON", "1")
    A, B, kw = _inputs(M, N, seed=M * N)
    out = evt.gemm(A, B, epilogue, backend="triton", config=CONFIGS[template], deterministic=deterministic, **kw)
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

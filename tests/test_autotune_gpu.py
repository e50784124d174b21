"""The autotuner on a GPU: a first call with tuning on times real candidates, runs the one it picked correctly and
leaves a record that says what was tried. The CPU tests (tests/test_gemm_template.py) drive ``pick_config`` with
made-up timings; here the timings are the kernels'. Run: ``TRITON_INTERPRET=0 pytest -m gpu tests``.
"""
import math

import pytest
import torch

import evtorch as evt
from evtorch.examples import EXAMPLES, eager_reference, operands
from evtorch.runtime import autotune, gemm
from evtorch.testing import rel_error

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.fixture
def fresh_tuning(tmp_path, monkeypatch):
    monkeypatch.setenv("EVTORCH_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("EVTORCH_AUTOTUNE", "1")
    monkeypatch.setenv("EVTORCH_POISON", "1")
    monkeypatch.setattr(gemm, "MAX_TUNE_CANDIDATES", 3)
    autotune.clear_memory_cache()
    yield tmp_path
    autotune.clear_memory_cache()


def test_first_call_tunes_runs_the_pick_and_records_what_it_tried(fresh_tuning):
    fn, make_inputs = EXAMPLES["lincomb_relu"]
    M, N, K = 1000, 768, 512
    torch.manual_seed(0)
    A, B = operands(M, N, K, "cuda", torch.bfloat16)
    inputs = make_inputs(M, N, "cuda", torch.bfloat16)
    out = evt.gemm(A, B, fn, **inputs)  # outputs poisoned with NaN before the launch
    assert not torch.isnan(out).any(), "unwritten elements"
    assert rel_error(out, eager_reference(fn, A, B, **inputs).to(out.dtype)) < 1e-2
    (record,) = autotune.stored_records()
    assert record["label"] == f"lincomb_relu at {M}x{N}x{K}"
    # shape buckets: 48 tiles of 128x128, less than a wave, so M and N by 128-row and -column tiles
    # (``autotune.problem_buckets``), K by powers of two
    assert autotune.key_fields(record["key"])["mnk"] == "1024x768x512"
    assert 1 <= len(record["candidates"]) <= 3 and record["best"] in record["candidates"].values()
    timed = {name: ms for name, ms in record["timings_ms"].items() if ms is not None}
    assert timed and all(math.isfinite(ms) and ms > 0 for ms in timed.values())
    assert record["best"].short() in timed


def test_graph_timing_is_the_kernel_time_with_l2_flushed(fresh_tuning):
    """``time_ms(graph=True)`` (one captured call, replayed with L2 flushed) against the call timed plainly by
    ``do_bench`` (also flushed, host work included): the same kernel, so the graph timing is no longer than the
    plain one beyond noise and not far below it at a size whose kernel outlasts the call's host work."""
    A, B = operands(4096, 4096, 4096, "cuda", torch.bfloat16)
    call = lambda: evt.gemm(A, B)  # noqa: E731
    call()
    graph = autotune.time_ms(call, graph=True, settle_ms=50)
    plain = autotune.time_ms(call, graph=False, settle_ms=50)
    assert 0.8 * plain < graph < 1.1 * plain


def test_final_times_the_finalists_interleaved_and_picks_by_its_rounds(fresh_tuning, monkeypatch):
    """With every candidate a finalist (REFINE_MARGIN widened), a first call runs the final on the real kernels: the
    record holds each finalist's FINAL_ROUNDS round times, all finite and positive, the pick is the one with the
    lowest median among them, and its result is right. At 8192x4096x1024 the calls last ~0.1 ms, so the rounds
    time graph replays; at 4096x4096x4096 (~0.25 ms and over) the calls themselves."""
    import statistics

    monkeypatch.setattr(autotune, "REFINE_MARGIN", 10.0)
    fn, make_inputs = EXAMPLES["column_broadcast"]  # two tile outputs and an aux input
    for M, N, K in ((8192, 4096, 1024), (4096, 4096, 4096)):
        torch.manual_seed(0)
        A, B = operands(M, N, K, "cuda", torch.bfloat16)
        inputs = make_inputs(M, N, "cuda", torch.bfloat16)
        outs = evt.gemm(A, B, fn, **inputs)
        refs = eager_reference(fn, A, B, **inputs)
        for out, ref in zip(outs, refs):
            assert not torch.isnan(out).any(), (M, N, K, "unwritten elements")
            assert rel_error(out, ref.to(out.dtype)) < 1e-2, (M, N, K, rel_error(out, ref.to(out.dtype)))
        (record,) = [r for r in autotune.stored_records() if r["label"].endswith(f" at {M}x{N}x{K}")]
        timed = [name for name, ms in record["timings_ms"].items() if ms is not None]
        final = record["final_ms"]
        assert len(final) == min(len(timed), autotune.REFINE_MAX) >= 2, record
        assert all(len(ts) == autotune.FINAL_ROUNDS and all(math.isfinite(t) and t > 0 for t in ts)
                   for ts in final.values()), record
        assert all(len(record["samples_ms"][name]) == 1 for name in final), record  # the final replaced the refine
        assert record["best"].short() == min(final, key=lambda name: statistics.median(final[name])), record


def test_first_call_keeps_the_gpu_busy_while_its_candidates_compile(fresh_tuning, monkeypatch):
    """A first call's compiles run beside cuBLAS's product of its operands in CUDA graphs (``load_graph``,
    ``busy_until``): the record says the GPU was loaded for most of the compile, the warm-up after it was
    asked for what was left of WARMUP_MS (its duration is not checked: one warm-up call takes longer on a GPU
    the other test workers share), and the pick's result is right."""
    asked = []
    warm_up = autotune._warm_up
    monkeypatch.setattr(autotune, "_warm_up", lambda cands, bench, ms: (asked.append(ms), warm_up(cands, bench, ms)))
    fn, make_inputs = EXAMPLES["lincomb_relu"]
    M, N, K = 4096, 4096, 2048
    torch.manual_seed(0)
    A, B = operands(M, N, K, "cuda", torch.bfloat16)
    inputs = make_inputs(M, N, "cuda", torch.bfloat16)
    out = evt.gemm(A, B, fn, **inputs)
    assert not torch.isnan(out).any() and rel_error(out, eager_reference(fn, A, B, **inputs).to(out.dtype)) < 1e-2
    (record,) = autotune.stored_records()
    phases = record["phases_s"]
    assert phases["loaded"] > 0.5 * phases["compile"] > 0, phases
    assert asked == [pytest.approx(max(autotune.WARMUP_MIN_MS, autotune.WARMUP_MS - phases["loaded"] * 1e3),
                                   abs=1.0)], (asked, phases)
    replay = autotune.load_graph(lambda: torch.matmul(A, B))
    assert replay is not None
    busy = autotune.busy_until(replay, iter([False] * 3 + [True]).__next__)
    assert busy >= 2 * autotune.LOAD_GRAPH_MS * 0.5

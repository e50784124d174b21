"""runtime.compile_pool: a tuning run's compiles recorded (and skipped) in the collecting thread only, handed to
worker processes, and found by the parent in Triton's disk cache afterwards (the last on a GPU)."""
import json
import threading
import types

import pytest
import torch
import triton

from evtorch.runtime import autotune, compile_pool, knobs, source_cache

KERNEL_SOURCE = '''
import triton
import triton.language as tl


@triton.jit
def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)
'''


@pytest.fixture
def kernel_module(tmp_path, monkeypatch):
    monkeypatch.setenv("EVTORCH_CACHE_DIR", str(tmp_path))
    source_cache.clear_memory_cache()
    yield source_cache.load_module(KERNEL_SOURCE, "pool_copy")
    source_cache.clear_memory_cache()


def _fire(module, index=0, data='{"name": "copy_kernel"}'):
    """Call the installed jit_cache_hook as Triton's ``JITFunction._call_hook`` does before a compile."""
    info = types.SimpleNamespace(module=module.__name__, name="copy_kernel", jit_function=module.copy_kernel)
    return triton.knobs.runtime.jit_cache_hook(
        key="k", repr="copy_kernel[...]", fn=info, compile={"key": "k", "device": index, "specialization_data": data},
        is_manual_warmup=False, already_compiled=False)


def test_collecting_skips_only_the_collecting_threads_compiles(kernel_module, monkeypatch):
    """In the block: this thread's compile is recorded (file, module name, kernel, Triton's data, device) and
    skipped (the hook returns True); another thread's goes to the hook installed before, whose answer stands;
    after the block that hook is back."""
    seen = []

    def previous(**kw):
        seen.append(kw["fn"].name)
        return False

    monkeypatch.setattr(triton.knobs.runtime, "jit_cache_hook", previous)
    other = []
    with compile_pool.collecting() as jobs:
        assert _fire(kernel_module, index=1, data='{"x": 1}') is True
        thread = threading.Thread(target=lambda: other.append(_fire(kernel_module)))
        thread.start()
        thread.join()
    assert other == [False] and seen == ["copy_kernel"]
    assert triton.knobs.runtime.jit_cache_hook is previous
    (job,) = jobs
    assert job.module_name == kernel_module.__name__ and job.kernel == "copy_kernel"
    assert job.module_file == kernel_module.__file__ and job.device_index == 1 and job.specialization == '{"x": 1}'
    assert job.triton_cache_dir == str(triton.knobs.cache.dir)


def test_collect_keeps_going_after_a_failing_run_and_drops_repeats(kernel_module):
    def run_twice():
        _fire(kernel_module, data='{"a": 1}')
        _fire(kernel_module, data='{"a": 1}')

    def run_and_fail():
        _fire(kernel_module, data='{"b": 2}')
        raise RuntimeError("OutOfResources: shared memory")

    jobs = compile_pool.collect([run_twice, run_and_fail, run_twice])
    assert [j.specialization for j in jobs] == ['{"a": 1}', '{"b": 2}']
    assert triton.knobs.runtime.jit_cache_hook is None


def test_load_file_imports_under_the_given_name(kernel_module):
    again = source_cache.load_file(kernel_module.__file__, kernel_module.__name__)
    assert again is kernel_module  # already imported in this process
    with pytest.raises(ValueError, match="module_name must be a generated module's name"):
        source_cache.load_file(kernel_module.__file__, "os")


def test_compile_workers_knob(monkeypatch):
    monkeypatch.setenv("EVTORCH_COMPILE_WORKERS", "3")
    assert compile_pool.workers() == 3
    monkeypatch.setenv("EVTORCH_COMPILE_WORKERS", "-1")
    with pytest.raises(ValueError, match="EVTORCH_COMPILE_WORKERS='-1' is not a non-negative integer"):
        compile_pool.workers()
    monkeypatch.delenv("EVTORCH_COMPILE_WORKERS")
    assert compile_pool.workers() >= 1
    assert "EVTORCH_COMPILE_WORKERS" in knobs.describe()


def test_compile_all_without_workers_leaves_every_job_to_the_caller(kernel_module, monkeypatch):
    monkeypatch.setenv("EVTORCH_COMPILE_WORKERS", "0")
    job = compile_pool.CompileJob(kernel_module.__file__, kernel_module.__name__, "copy_kernel", "{}", 0, None)
    assert compile_pool.compile_all([job]) == {job: "compile workers disabled"}
    assert compile_pool.precompile([lambda: None]) == {}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the failure report of a worker without CUDA")
def test_a_worker_reports_its_failure_instead_of_raising(kernel_module, monkeypatch):
    """A real spawned worker imports the generated module by file and name and finds the kernel; on this CUDA-less
    machine the compile then fails, and the failure comes back as text (the parent compiles that kernel itself)."""
    monkeypatch.setenv("EVTORCH_COMPILE_WORKERS", "1")
    good = compile_pool.CompileJob(kernel_module.__file__, kernel_module.__name__, "copy_kernel", "{}", 0, None)
    missing = compile_pool.CompileJob(kernel_module.__file__, kernel_module.__name__, "no_such_kernel", "{}", 0, None)
    try:
        out = compile_pool.compile_all([good, missing], timeout_s=120)
    finally:
        compile_pool.shutdown()
    assert out[missing].startswith("AttributeError") and "no_such_kernel" in out[missing]
    assert out[good] is not None and "cuda" in out[good].lower() and "copy_kernel" not in out[good]


def test_a_job_past_its_deadline_is_given_back_and_its_worker_stopped(kernel_module, monkeypatch):
    """No hang: a worker still busy at the deadline (here: still importing torch) is killed, its job reported as
    not compiled, and the next call starts a fresh worker."""
    monkeypatch.setenv("EVTORCH_COMPILE_WORKERS", "1")
    job = compile_pool.CompileJob(kernel_module.__file__, kernel_module.__name__, "no_such_kernel", "{}", 0, None)
    try:
        compile_pool.shutdown()
        out = compile_pool.compile_all([job], timeout_s=0.01)
        assert out[job] is not None and ("not compiled within" in out[job] or "exited" in out[job])
        assert not any(w.alive() for w in compile_pool._pool)
        again = compile_pool.compile_all([job], timeout_s=120)  # a fresh worker answers
        assert again[job].startswith("AttributeError")
    finally:
        compile_pool.shutdown()


def test_autotune_hands_every_candidate_to_the_workers_before_the_threads(monkeypatch, tmp_path):
    """pick_config's prepare step: first ``precompile`` with one run per candidate (the runs are the candidates'
    prepare calls), then the threads' prepare calls, then timing."""
    from evtorch.codegen.configs import DeviceInfo, candidate_configs

    A100 = DeviceInfo("cuda", "NVIDIA A100-SXM4-80GB", (8, 0), 108, 166912)
    monkeypatch.setenv("EVTORCH_CACHE_DIR", str(tmp_path))
    autotune.clear_memory_cache()
    cands = candidate_configs(4096, 4096, 4096, torch.float16, A100)[:3]
    events = []

    def precompile(runs):
        events.append(("precompile", len(runs)))
        for run in runs:
            run()
        return {}

    monkeypatch.setattr(compile_pool, "precompile", precompile)
    key = autotune.tune_key(device_name=A100.name, M=4096, N=4096, K=4096, L=1, dtypes=[torch.float16],
                            layout="A:row,B:row,bat:-", epilogue_hash="pool", templates=["portable"])
    autotune.pick_config(cands, lambda c: events.append(("bench", c)) or 1.0, key=key, heuristic=cands[0],
                         device=A100, progress=False, prepare=lambda c: events.append(("prepare", c)))
    assert events[0] == ("precompile", 3)
    assert [e[0] for e in events[1:7]] == ["prepare"] * 6 and {e[1] for e in events[1:4]} == set(cands)
    assert events[7][0] == "bench"
    autotune.clear_memory_cache()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_tuning_compiles_in_workers_and_the_parent_finds_every_kernel_cached(tmp_path, monkeypatch):
    """A first call with tuning on a fresh cache: the workers compile every candidate's kernels (no failures),
    the parent then compiles nothing new (Triton's cache directory does not grow after the workers are done),
    and the result matches the fp32 reference with poisoned outputs."""
    import evtorch as evt
    from evtorch.examples import EXAMPLES, eager_reference, operands
    from evtorch.runtime import gemm
    from evtorch.testing import rel_error

    monkeypatch.setenv("EVTORCH_CACHE_DIR", str(tmp_path / "evt"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setenv("EVTORCH_AUTOTUNE", "1")
    monkeypatch.setenv("EVTORCH_POISON", "1")
    monkeypatch.setenv("EVTORCH_COMPILE_WORKERS", "4")
    source_cache.clear_memory_cache()
    autotune.clear_memory_cache()
    gemm.clear_caches()
    after_workers = {}
    real = compile_pool.compile_all

    def compile_all(jobs, timeout_s=600.0):
        out = real(jobs, timeout_s)
        after_workers["results"] = out
        after_workers["files"] = sorted(p.name for p in (tmp_path / "triton").iterdir())
        return out

    monkeypatch.setattr(compile_pool, "compile_all", compile_all)
    try:
        example = EXAMPLES["row_reduction"]  # a tile output and a row reduction
        torch.manual_seed(0)
        A, B = operands(1000, 1024, 512, "cuda", torch.bfloat16)
        inputs = example.make_inputs(1000, 1024, "cuda", torch.bfloat16)
        out = evt.gemm(A, B, example.fn, **inputs)
        torch.cuda.synchronize()
    finally:
        compile_pool.shutdown()
        source_cache.clear_memory_cache()
        autotune.clear_memory_cache()
        gemm.clear_caches()
    results = after_workers["results"]
    assert results and all(err is None for err in results.values()), results
    assert sorted(p.name for p in (tmp_path / "triton").iterdir()) == after_workers["files"]
    ref = eager_reference(example.fn, A, B, **inputs)
    outs = out if isinstance(out, tuple) else (out,)
    refs = ref if isinstance(ref, tuple) else (ref,)
    for o, r in zip(outs, refs):
        assert rel_error(o, r) < 2e-2

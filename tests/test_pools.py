"""``runtime.pools``: what evtorch may keep across calls (cached constants, per-stream buffers) when a CUDA graph
is captured or torch.compile's CUDA-graph trees warm one up. The snapshot lookup is checked here with a stand-in
allocator; the GPU test runs the case that needs it, a process whose first evtorch backward is a warm-up."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from evtorch.runtime import pools


def fake_cuda_tensor(ptr, index=0):
    return SimpleNamespace(is_cuda=True, device=SimpleNamespace(index=index),
                           untyped_storage=lambda: SimpleNamespace(data_ptr=lambda: ptr))


def snapshot(*segments):
    return lambda **kw: [dict(device=d, address=a, total_size=n, segment_pool_id=p) for d, a, n, p in segments]


def test_cpu_tensors_are_always_keepable():
    assert pools.keepable(torch.zeros(3))


def test_private_pool_lookup(monkeypatch):
    monkeypatch.setattr(pools, "_snapshots_usable", True)
    monkeypatch.setattr(torch.cuda, "memory_snapshot", snapshot((0, 1000, 512, (0, 0)), (0, 4096, 1024, (1, 7)),
                                                                 (1, 4096, 1024, (0, 0))))
    assert not pools.in_private_pool(fake_cuda_tensor(1100))           # inside the default pool's segment
    assert pools.in_private_pool(fake_cuda_tensor(4096 + 1023))        # a graph's pool
    assert not pools.in_private_pool(fake_cuda_tensor(4100, index=1))  # same address, other device: default
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert pools.keepable(fake_cuda_tensor(1100)) and not pools.keepable(fake_cuda_tensor(4200))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert not pools.keepable(fake_cuda_tensor(1100))  # capturing: never kept


@pytest.mark.parametrize("how", ["raises", "not found"])
def test_snapshot_that_cannot_tell_is_not_asked_again(monkeypatch, how):
    """A snapshot that raises, or lacks a tensor the caching allocator just made: the check answers "default pool"
    (keep, outside a capture, as before it existed) and stops asking, so a cache still fills."""
    monkeypatch.setattr(pools, "_snapshots_usable", True)
    asked = []

    def snap(**kw):
        asked.append(1)
        if how == "raises":
            raise RuntimeError("no snapshots here")
        return [dict(device=0, address=0, total_size=16, segment_pool_id=(0, 0))]
    monkeypatch.setattr(torch.cuda, "memory_snapshot", snap)
    assert not pools.in_private_pool(fake_cuda_tensor(1 << 20))
    assert not pools.in_private_pool(fake_cuda_tensor(1 << 20)) and len(asked) == 1
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert pools.keepable(fake_cuda_tensor(1 << 20))


def test_constants_and_scan_buffers_follow_keepable(monkeypatch):
    """Each cache asks ``keepable`` on a miss: refused, it hands the fresh tensor out and keeps nothing."""
    import evtorch.integration.ops as ops
    import importlib

    scan_launch = importlib.import_module("evtorch.scan.launch")

    monkeypatch.setattr(ops, "_constants", {})
    monkeypatch.setattr(ops, "keepable", lambda t: False)
    a, b = ops._constant(0.5, torch.float32, "cpu"), ops._constant(0.5, torch.float32, "cpu")
    assert a is not b and not ops._constants and float(a) == 0.5
    assert not ops._is_constant(a.expand(4))  # the K = 0 operands' views are kept only with their constant
    monkeypatch.setattr(ops, "keepable", lambda t: True)
    kept = ops._constant(0.5, torch.float32, "cpu")
    assert kept is ops._constant(0.5, torch.float32, "cpu") and ops._is_constant(kept.as_strided((3, 0), (0, 0)))

    monkeypatch.setattr(scan_launch, "_SYNC", {})
    monkeypatch.setattr(scan_launch, "keepable", lambda t: False)
    buf, tbase, epoch, done = scan_launch.sync_args(torch.device("cpu"), 100, 3)
    done()
    assert (tbase, epoch) == (0, 1) and not scan_launch._SYNC and int(buf.abs().sum()) == 0
    monkeypatch.setattr(scan_launch, "keepable", lambda t: True)
    buf, tbase, epoch, done = scan_launch.sync_args(torch.device("cpu"), 100, 3)
    done()
    assert (tbase, epoch) == (0, 1) and len(scan_launch._SYNC) == 1
    again, tbase, epoch, _ = scan_launch.sync_args(torch.device("cpu"), 100, 3)  # the kept buffer, counted on
    assert again is buf and (tbase, epoch) == (3, 2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_first_evtorch_calls_inside_a_reduce_overhead_warm_up():
    """A fresh process whose first evtorch forward and backward (an ``evt.linear`` with bias + GELU: its backward
    makes a K = 0 pass, whose operand constant evtorch caches) run inside torch.compile's CUDA-graph trees'
    warm-up: five steps, against the fp32 reference. A cache filled in the warm-up would hold memory of the
    graph's pool, which the trees refuse on the next step."""
    script = "from helpers import check_reduce_overhead_steps; check_reduce_overhead_steps(False); print('ok')"
    here = Path(__file__).resolve().parent  # the checkout and its tests' helpers, importable as pytest has them
    path = os.pathsep.join(p for p in (str(here.parent), str(here), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "TRITON_INTERPRET": "0", "EVTORCH_AUTOTUNE": "0", "PYTHONPATH": path}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-4000:]


def test_snapshot_of_an_older_torch(monkeypatch):
    """torch before ``include_traces``: the plain call."""
    monkeypatch.setattr(pools, "_snapshots_usable", True)
    segments = snapshot((0, 1000, 512, (0, 0)))
    monkeypatch.setattr(torch.cuda, "memory_snapshot", lambda: segments())
    assert not pools.in_private_pool(fake_cuda_tensor(1000))

"""Whether a tensor allocated just now may be kept across calls (a cache of constants, a per-stream buffer).

Why: two things route a call's CUDA allocations into a CUDA graph's private memory pool, and a tensor kept from
such a call outlives what owns the pool:

- a capture (``torch.cuda.graph``): its address is baked into the graph, and the pool's memory is the graph's;
- torch.compile's CUDA-graph trees (``mode="reduce-overhead"``) warming a graph up: the warm-up runs eagerly, on
  the trees' own stream, with every allocation of the thread sent to the graph's pool
  (``torch._C._cuda_beginAllocateCurrentThreadToPool``), and no capture under way to detect. The trees then check
  that every live allocation in the pool is one of their tracked outputs and refuse the step otherwise
  ("Detected 1 tensor(s) in the cudagraph pool not tracked as outputs": an ``evt.linear`` step failed so on an
  H200 on 2026-11-28, with a TMA scratch buffer kept per stream; without the check the pool would hand the
  memory to the graph's next tensors).

torch has no query for the second case, so ``keepable`` looks the new tensor up in the caching allocator's
snapshot: a block of the default pool (id (0, 0)) may be kept, one of any other pool may not. The snapshot costs
milliseconds in a large process, so callers ask only when they are about to keep something new (a cache miss),
never on a hit; and where the snapshot cannot tell, the check steps aside for good (``in_private_pool``), leaving
the capture check alone, as before it existed.
"""
from __future__ import annotations

import torch

DEFAULT_POOL = (0, 0)


def _segments() -> list:
    """The caching allocator's segments, without its trace entries where this torch can leave them out (2.13's
    ``include_traces``; a process recording its memory history would otherwise copy every entry)."""
    try:
        return torch.cuda.memory_snapshot(include_traces=False)
    except TypeError:
        return torch.cuda.memory_snapshot()


_snapshots_usable = True


def in_private_pool(t: torch.Tensor) -> bool:
    """Whether CUDA tensor ``t``'s memory belongs to a pool other than the caching allocator's default one (a CUDA
    graph's, a ``torch.cuda.MemPool``'s), by the allocator's snapshot.

    Where the snapshot cannot tell (it raises, or does not hold the tensor: another allocator behind torch, a
    torch whose snapshot differs) this answers False from then on without asking again: callers then keep what
    they allocate outside a capture, as evtorch did before this check, rather than pay a snapshot on every call
    of a cache that could never fill."""
    global _snapshots_usable
    if not _snapshots_usable:
        return False
    try:
        ptr = t.untyped_storage().data_ptr()
        index = t.device.index if t.device.index is not None else torch.cuda.current_device()
        for seg in _segments():
            if seg.get("device", index) == index and seg["address"] <= ptr < seg["address"] + seg["total_size"]:
                return tuple(seg["segment_pool_id"]) != DEFAULT_POOL
    except Exception:  # noqa: BLE001 - see the docstring
        pass
    _snapshots_usable = False
    return False


def keepable(t: torch.Tensor) -> bool:
    """Whether ``t``, allocated just now, may be kept and reused by later calls: always off CUDA; on CUDA not while
    the current stream is being captured into a CUDA graph, nor when its memory came from a private pool (see
    the module doc)."""
    if not t.is_cuda:
        return True
    return not torch.cuda.is_current_stream_capturing() and not in_private_pool(t)

"""Direct kernel launches: Triton's launcher for an already compiled kernel, without ``JITFunction.run``.

Why: a fused GEMM kernel takes 40 to 60 arguments, and ``fn[grid](*args, **constexprs)`` re-derives everything
about them on every call: it binds them to the signature, specialises each one (dtype, 16-byte alignment, integers
equal to 1), turns the specialisation into a cache key string, finds the compiled kernel, canonicalises the grid,
builds launch metadata and calls the launch hooks. Measured on an H200 machine (torch 2.11, Triton 3.6,
``benchmarks/host_overhead.py --device cuda --real``): ``evt.gemm(A, B)`` cost 51 us of host time per call, 30 us of
it in ``JITFunction.run`` around a C launcher that itself takes about 7 us; ``torch.matmul`` took 11.5 us. Below
about 0.1 ms of kernel the public call was host-bound.

How: a ``DirectLaunch`` belongs to one launch signature (kernel, grid, constexpr values, launch options), which
its owner (``runtime.gemm._Launch``) has already fixed by shapes, strides and dtypes. The only argument properties
left that Triton specialises on are those of the arguments that change from call to call: a tensor's 16-byte
alignment, an integer being 1, divisible by 16 or wider than 32 bits. The caller passes a key of exactly those
(``arg_key`` of each varying argument). The first launch with a key goes through ``fn[grid]``, which compiles or
finds the kernel and returns it; later launches with that key call the compiled kernel's launcher directly, with
the argument list ``JITFunction.run`` would pass (every parameter in signature order, constexprs included, which
the launcher skips), the current CUDA stream, and no launch metadata.

The JIT path is taken instead whenever a launch hook is installed (profilers such as proton read launch
metadata), and under the interpreter ``DirectLaunch`` is not used at all (``make_launch``).
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

import torch

from . import knobs

# Keys remembered per launch; more would mean a caller whose key varies without bound (then the JIT path,
# which has its own cache, still works: the oldest keys are dropped).
MAX_KEYS = 16

_UNKNOWN = object()


def arg_key(value: Any) -> Any:
    """What Triton specialises a runtime argument on, for the argument kinds a fused GEMM call varies: a tensor's
    16-byte alignment; an integer's (== 1, % 16 == 0, width class); a bool's value; nothing for a float. Other
    kinds give ``_UNKNOWN`` (the launch then always takes the JIT path)."""
    t = type(value)
    if t is float:
        return 0.0
    if t is bool:
        return value
    if t is int:
        return (value == 1, value % 16 == 0, -(2 ** 31) <= value < 2 ** 31, value < 2 ** 63)
    if isinstance(value, torch.Tensor):
        return value.data_ptr() % 16 == 0
    return _UNKNOWN


def _hooks_active(rt) -> bool:
    """Whether a launch enter/exit hook is installed on Triton's runtime knobs ``rt`` (a ``HookChain`` with calls
    in Triton 3.6 and 3.9; a plain callable or None in older versions)."""
    for hook in (rt.launch_enter_hook, rt.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):
            return True
    return False


class DirectLaunch:
    """``fn[grid](*args, **kwargs)`` for one launch signature, called as ``launch(key, *args)``: ``args`` are
    the leading positional arguments (every non-constexpr parameter, in order), ``kwargs`` the rest of the
    parameters (constexprs, by name) and launch options (num_warps, num_stages, maxnreg, ...)."""

    __slots__ = ("fn", "grid", "kwargs", "tail", "kernels", "device_index", "_stream", "_runtime", "g0", "g1", "g2")

    def __init__(self, fn, grid: tuple, n_positional: int, kwargs: dict, device_index: int,
                 stream: Callable[[int], int] | None = None):
        names = list(fn.arg_names)
        missing = [n for i, n in enumerate(names) if i >= n_positional and n not in kwargs
                   and fn.params[i].default is inspect.Parameter.empty]
        if missing:
            raise ValueError(f"DirectLaunch of {fn.__name__}: no value for parameter(s) {missing}")
        self.fn, self.grid, self.kwargs = fn, grid, dict(kwargs)
        # the parameters after the positional ones, in signature order (JITFunction.run passes them all)
        self.tail = tuple(kwargs[n] if n in kwargs else fn.params[i].default
                          for i, n in enumerate(names) if i >= n_positional)
        self.kernels: dict = {}
        self.device_index = device_index
        import triton

        self._runtime = triton.knobs.runtime  # launch hooks live here (read per launch: profilers come and go)
        if stream is None:  # Triton's own: torch's current raw stream of a device index
            stream = triton.runtime.driver.active.get_current_stream
        self._stream = stream
        g = tuple(grid) + (1, 1)
        self.g0, self.g1, self.g2 = g[0], g[1], g[2]

    def __call__(self, key, *args) -> None:
        kernel = self.kernels.get(key)
        if kernel is None or _hooks_active(self._runtime):
            return self._jit(key, args)
        kernel.run(self.g0, self.g1, self.g2, self._stream(self.device_index), kernel.function,
                   kernel.packed_metadata, None, None, None, *args, *self.tail)

    def _jit(self, key, args) -> None:
        kernel = self.fn[self.grid](*args, **self.kwargs)
        if kernel is None or _UNKNOWN in key:
            return
        if hasattr(kernel, "result"):  # an asynchronous compile's future
            kernel = kernel.result()
        if len(self.kernels) >= MAX_KEYS:
            self.kernels.pop(next(iter(self.kernels)))
        self.kernels[key] = kernel


def make_launch(fn, grid: tuple, n_positional: int, kwargs: dict, device_index: int | None) -> Callable:
    """``launch(key, *args)``: a ``DirectLaunch`` on a CUDA device with the real compiler, else ``fn[grid]``
    behind the same calling convention (the interpreter runs ``InterpretedFunction``s, which have no compiled
    kernel; ``EVTORCH_DIRECT_LAUNCH=0`` forces the JIT path everywhere, to compare or to rule it out)."""
    if device_index is None or knobs.interpreter_active() or not knobs.direct_launch_enabled():
        run = fn[grid]

        def launch(key, *args):
            run(*args, **kwargs)
        return launch
    return DirectLaunch(fn, grid, n_positional, kwargs, device_index)

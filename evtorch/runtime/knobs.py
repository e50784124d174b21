"""Every environment variable evtorch reads, declared once and typed.

Why a registry instead of scattered ``os.environ.get`` calls: the set of knobs is then documented in one
place (``describe()`` prints it, the CLI can show it), every knob parses the same way ("0", "false", "off"
all mean off), and tests can change the environment at any time because values are read on each call,
never frozen at import.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Generic, TypeVar

T = TypeVar("T")

_FALSE = {"", "0", "false", "no", "off"}
_TRUE = {"1", "true", "yes", "on"}


def _parse_bool(name: str, text: str) -> bool:
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"environment variable {name}={text!r} is not a boolean (use 1/0, true/false, on/off)")


def _parse_path(name: str, text: str) -> Path:
    if not text.strip():
        raise ValueError(f"environment variable {name} is set but empty")
    return Path(os.path.expandvars(text.strip())).expanduser()


@dataclass(frozen=True)
class Knob(Generic[T]):
    """One environment variable: its name, default, parser and the reason it exists."""

    name: str
    default: Callable[[], T]
    parse: Callable[[str, str], T]
    doc: str

    def get(self) -> T:
        """Current value, read from the environment now (not cached, so monkeypatching works)."""
        text = os.environ.get(self.name)
        if text is None:
            return self.default()
        return self.parse(self.name, text)


CACHE_DIR: Knob[Path] = Knob(
    "EVTORCH_CACHE_DIR",
    lambda: Path("~/.cache/evtorch").expanduser(),
    _parse_path,
    "root of generated kernel sources (kernels/) and autotuning results (autotune/)",
)
AUTOTUNE: Knob[bool] = Knob(
    "EVTORCH_AUTOTUNE",
    lambda: True,
    _parse_bool,
    "1: benchmark candidate GEMM configs on first use of a shape bucket; 0: use the heuristic config",
)
DEBUG: Knob[bool] = Knob(
    "EVTORCH_DEBUG",
    lambda: False,
    _parse_bool,
    "1: run the IR verifier after every pass (slow; for development)",
)
TRITON_INTERPRET: Knob[bool] = Knob(
    "TRITON_INTERPRET",
    lambda: False,
    _parse_bool,
    "read, not owned: when 1, Triton runs kernels through its NumPy interpreter on CPU tensors",
)

ALL_KNOBS: tuple[Knob, ...] = (CACHE_DIR, AUTOTUNE, DEBUG, TRITON_INTERPRET)


def raw_reader(*knobs: Knob):
    """``(get, keys)`` for reading the raw environment text of ``knobs`` on a per-call hot path: ``get(key)`` is
    the text or None. CPython's ``os.environ.get`` costs ~0.8 us a name (it encodes the name and raises KeyError
    inside for an unset one); the mapping behind it, with the names encoded once, costs a dict lookup."""
    try:
        return os.environ._data.get, tuple(os.environ.encodekey(k.name) for k in knobs)
    except AttributeError:  # not CPython's os.environ
        return os.environ.get, tuple(k.name for k in knobs)


def cache_dir() -> Path:
    """Root cache directory (EVTORCH_CACHE_DIR, default ~/.cache/evtorch). Not created here."""
    return CACHE_DIR.get()


def autotune_enabled() -> bool:
    """Whether GEMM configs are benchmarked (EVTORCH_AUTOTUNE, default on)."""
    return AUTOTUNE.get()


def debug_enabled() -> bool:
    """Whether the verifier runs after every pass (EVTORCH_DEBUG, default off)."""
    return DEBUG.get()


def interpreter_active() -> bool:
    """Whether Triton's CPU interpreter is on (TRITON_INTERPRET=1).

    Triton reads this variable when a ``@triton.jit`` function is *created* (the decorator picks
    InterpretedFunction vs JITFunction), so it must be set before generated modules are imported;
    evtorch reads it to choose small tile configs and skip autotuning.
    """
    return TRITON_INTERPRET.get()


def describe() -> str:
    """Human-readable table of all knobs with their current values."""
    lines = []
    for knob in ALL_KNOBS:
        try:
            value = knob.get()
        except ValueError as exc:  # show the error instead of failing the listing
            value = f"<invalid: {exc}>"
        lines.append(f"{knob.name}={value}  # {knob.doc}")
    return "\n".join(lines)

POISON: Knob[bool] = Knob(
    "EVTORCH_POISON",
    lambda: False,
    _parse_bool,
    "1: fill outputs with NaN (integers: -1) before kernels run, so an unwritten element fails a check",
)
ALL_KNOBS = ALL_KNOBS + (POISON,)


def _parse_mode(name: str, text: str) -> str:
    """auto / always / never, with the booleans as aliases (1 = auto, 0 = never)."""
    value = text.strip().lower()
    if value in ("auto", "always", "never"):
        return value
    if value in _TRUE or value in _FALSE:
        return "auto" if value in _TRUE else "never"
    raise ValueError(f"environment variable {name}={text!r} is not one of auto, always, never (or 1/0)")


FUSE_BACKWARD: Knob[str] = Knob(
    "EVTORCH_FUSE_BACKWARD",
    lambda: "auto",
    _parse_mode,
    "cross-layer backward fusion (integration/deferred.py): auto (or 1; the default) fuses a layer's backward "
    "epilogue into the next evtorch layer's input-gradient GEMM where timed faster (not fused when nothing can "
    "be timed); always; never (or 0)",
)
ALL_KNOBS = ALL_KNOBS + (FUSE_BACKWARD,)


def _parse_choice(*values: str) -> Callable[[str, str], str]:
    """A parser of one of ``values`` (case and surrounding spaces ignored); a ValueError naming them otherwise."""
    def parse(name: str, text: str) -> str:
        value = text.strip().lower()
        if value in values:
            return value
        raise ValueError(f"environment variable {name}={text!r} is not one of {', '.join(values)}")
    return parse


BACKWARD_GEMM: Knob[str] = Knob(
    "EVTORCH_BACKWARD_GEMM",
    lambda: "auto",
    _parse_choice("auto", "torch", "evtorch"),
    "who runs a backward's plain GEMMs (dA = d(acc) @ B^T, dB = A^T @ d(acc), no epilogue; integration/ops.py "
    "EagerBackward): auto (the default) torch.matmul (cuBLAS) for float16 / bfloat16 operands on a GPU unless "
    "deterministic=True, evtorch's kernels otherwise; torch (torch.matmul for 16-bit operands on any device); "
    "evtorch (always evtorch's kernels)",
)
ALL_KNOBS = ALL_KNOBS + (BACKWARD_GEMM,)


def poison_enabled() -> bool:
    """Whether outputs are poisoned before launch (EVTORCH_POISON; tests and the selftest turn it on)."""
    return POISON.get()


FAST_MATH: Knob[str] = Knob(
    "EVTORCH_FAST_MATH",
    lambda: "auto",
    _parse_mode,
    "hardware tanh/sigmoid approximations in kernels compiled for a GPU (never under the interpreter; "
    "codegen/fastmath.py): auto (or 1; the default) tanh where every value it produces is rounded to fp16/bf16 "
    "before it reaches an output, sigmoid and logsigmoid everywhere (measured as accurate as the accurate ones); "
    "always (every op with a fast emission, fp32 outputs and reductions included); never (or 0)",
)
ALL_KNOBS = ALL_KNOBS + (FAST_MATH,)


def fast_math_mode() -> str:
    """EVTORCH_FAST_MATH: 'auto', 'always' or 'never' (see codegen/fastmath.py)."""
    return FAST_MATH.get()


DIRECT_LAUNCH: Knob[bool] = Knob(
    "EVTORCH_DIRECT_LAUNCH",
    lambda: True,
    _parse_bool,
    "1 (default): after a call signature's first launch, launch its compiled kernels through Triton's launcher "
    "directly (runtime/launcher.py: ~20 us less host time per kernel); 0: every launch through fn[grid](...). "
    "Read when a call signature is first prepared",
)
ALL_KNOBS = ALL_KNOBS + (DIRECT_LAUNCH,)


def direct_launch_enabled() -> bool:
    """EVTORCH_DIRECT_LAUNCH (default on; see runtime/launcher.py)."""
    return DIRECT_LAUNCH.get()


def _parse_names(name: str, text: str) -> frozenset:
    """A comma-separated list of names (spaces ignored; empty means none)."""
    return frozenset(part.strip() for part in text.split(",") if part.strip())


DISABLE_PASSES: Knob[frozenset] = Knob(
    "EVTORCH_DISABLE_PASSES",
    frozenset,
    _parse_names,
    "comma-separated optimization passes to skip (passes/pipeline.py OPTIONAL: stable, fuse_fma, reassociate, "
    "composite_grads), for A/B "
    "measurements (benchmarks/ab_check.py) and for bisecting a numerical difference; read when an epilogue is traced",
)
ALL_KNOBS = ALL_KNOBS + (DISABLE_PASSES,)


def disabled_passes() -> frozenset:
    """EVTORCH_DISABLE_PASSES: names of optional passes to skip (default none)."""
    return DISABLE_PASSES.get()


INTERMEDIATE_MODES = ("eager", "float32")


INTERMEDIATES: Knob[str] = Knob(
    "EVTORCH_INTERMEDIATES",
    lambda: "eager",
    _parse_choice(*INTERMEDIATE_MODES),
    "eager (default): a 16-bit intermediate (beta * C with a bf16 C) is rounded to 16 bits where eager PyTorch "
    "rounds it; float32: kept in float32, as torch.compile does, except explicit casts and values that reach a "
    "comparison or a min/max (passes/intermediates.py). Read when an epilogue is traced",
)
ALL_KNOBS = ALL_KNOBS + (INTERMEDIATES,)


def intermediates_mode() -> str:
    """EVTORCH_INTERMEDIATES: 'eager' or 'float32' (see passes/intermediates.py)."""
    return INTERMEDIATES.get()


def _parse_positive_int(name: str, text: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"environment variable {name}={text!r} is not a positive integer")
    return value


COMPILE_WORKERS: Knob[int] = Knob(
    "EVTORCH_COMPILE_WORKERS",
    lambda: 8,
    _parse_positive_int,
    "threads that compile a first call's candidate configs before the tuner times them (default 8, at most the "
    "CPU count); lower it where several processes share the CPU (benchmarks/gpu_tests.py gives each shard its "
    "share)",
)
ALL_KNOBS = ALL_KNOBS + (COMPILE_WORKERS,)


def compile_workers() -> int:
    """EVTORCH_COMPILE_WORKERS: the tuner's compile threads (runtime/autotune.py ``_prepare_all``)."""
    return COMPILE_WORKERS.get()


#: the knobs an epilogue's trace reads (its optimized graph depends on them): their text is part of every cache
#: key that stands for a traced epilogue (api's trace cache and call signatures, integration/function.py's plans)
TRACE_KNOBS: tuple[Knob, ...] = (DISABLE_PASSES, INTERMEDIATES)

_trace_get, _TRACE_NAMES = raw_reader(*TRACE_KNOBS)


def trace_knobs_text() -> tuple:
    """The raw environment text of ``TRACE_KNOBS`` (a dict lookup each: cheap enough for per-call keys). The
    Epilogue parses the knobs itself, so a bad value is refused where it is traced."""
    return tuple(_trace_get(k) for k in _TRACE_NAMES)

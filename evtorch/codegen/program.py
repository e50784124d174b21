"""One generated module per (epilogue graph, options): epilogue function, GEMM kernels, vector-stage kernel.

The module source depends only on the optimized IR (its structural hash: ops, dtypes, shape classes), the
reduction mode (``deterministic``), the templates and the nodes emitted with a hardware approximation
(``codegen/fastmath.py``: a function of the IR, the output dtypes and ``EVTORCH_FAST_MATH``, part of the program
hash); never on sizes or scalar values. Triton then
specialises each kernel on A/B/output dtypes and a few stride properties at launch, which is where the
layout class enters. Sources are written under ``EVTORCH_CACHE_DIR/kernels`` (atomically) together with the
IR text, so a user can read exactly what runs.
"""
from __future__ import annotations

import functools
import hashlib
import threading
from dataclasses import dataclass
from types import ModuleType

import torch

from ..runtime.source_cache import kernel_path, load_module, write_text_atomic
from . import fastmath, gluon_template
from .epilogue import EpilogueCode, EpilogueEmitter
from .gemm_template import HEADER, kernel_symbol, render_gemm_kernels
from .vector_stage import VBLOCK, VectorCode, VectorEmitter

# Every template the installed Triton can build: the Gluon ping-pong kernel only where Gluon's Hopper API exists.
TEMPLATES = ("portable", "splitk", "persistent_tma") + (("pingpong",) if gluon_template.available() else ())
KERNEL_BASE = "gemm"


def kernel_base(program_key: tuple) -> str:
    """The prefix of a program's GEMM kernel names: ``gemm_<IR hash, 8 digits>`` then ``_<template>``
    (``gemm_3fa9c2d1_persistent_tma``). Why the hash: a profiler or Nsight trace then tells one epilogue's kernels
    from another's (with one name for all, a slow backward GEMM hid among the forward ones), and the same digits
    start the generated module's file name (``evt_<hash>.py`` under ``EVTORCH_CACHE_DIR/kernels``)."""
    return f"{KERNEL_BASE}_{program_key[0][:8]}"


@dataclass
class Program:
    key: tuple
    source: str
    epilogue: EpilogueCode
    vector: VectorCode | None
    _module: ModuleType | None = None

    @property
    def kernel_base(self) -> str:
        """The prefix of this program's GEMM kernel names (``kernel_base``)."""
        return kernel_base(self.key)

    @functools.cached_property
    def tune_hash(self) -> str:
        """What the tuner's cache is keyed by: the epilogue (IR hash, fast-math nodes) and the generated source,
        so that timings taken with an older code generator are not reused after it changes."""
        return f"{self.key[0]}-{hashlib.sha256(self.source.encode()).hexdigest()[:12]}"

    @property
    def module(self) -> ModuleType:
        if self._module is None:
            with _lock:
                if self._module is None:
                    module = load_module(self.source, f"evt_{self.key[0]}")
                    for name, fn in self.epilogue.user_ops.items():  # user-registered @triton.jit ops
                        setattr(module, name, fn)
                    self._module = module
        return self._module


_lock = threading.Lock()
_programs: dict[tuple, Program] = {}


def build_program(ep, dtype=None, *, deterministic: bool = False, templates=TEMPLATES, out_dtype=None,
                  fast_math=None) -> Program:
    """The generated program for epilogue ``ep``. Kernels are dtype-generic (Triton specialises them at launch);
    ``out_dtype`` (default ``dtype``, then float16) is the dtype full-size outputs are stored in, which decides
    with ``fast_math`` where tanh / sigmoid use hardware approximations (``codegen/fastmath.py``). ``fast_math``:
    None decides as the runtime does on a GPU (``EVTORCH_FAST_MATH``, 'never' under the interpreter), or a mode
    ('auto', 'always', 'never') / bool for inspection."""
    mode = fastmath.resolve_mode(fast_math)
    graph, emissions = fastmath.plan(ep, out_dtype or dtype or torch.float16, mode)
    key = (fastmath.program_hash(graph.structural_hash(), emissions), str(ep.acc_dtype), bool(deterministic),
           ep.batched, tuple(templates))
    prog = _programs.get(key)
    if prog is not None:
        return prog
    epi = EpilogueEmitter(graph, ep.acc_dtype, deterministic, ep.batched, emissions=emissions).emit()
    vec_emitter = VectorEmitter(graph, epi.reductions, ep.acc_dtype)
    vec = None if vec_emitter.empty() else vec_emitter.emit()
    pingpong = "pingpong" in templates
    scalars = epi.params.names("scalar")  # runtime values: never specialised
    parts = [
        HEADER + (gluon_template.HEADER if pingpong else "") + "from evtorch.codegen import tlmath\n",
        f'"""evtorch generated kernels for epilogue {ep.name!r} (IR hash {key[0]}).\n\n'
        + "\n".join(f"    {line}" for line in str(graph).splitlines() + [""]
                     + fastmath.describe(graph, emissions, reassociated=graph is not ep.graph)) + '\n"""\n',
        epi.source,
        render_gemm_kernels(kernel_base(key), epi.fn_name, epi.params.names(),
                            tuple(t for t in templates if t != "pingpong"), epi.prefetch, scalars,
                            epi.params.annotations()),
        f"EPILOGUE_PREFETCH = {epi.prefetch}  # M x N input tiles the epilogue can take prefetched\n",
    ]
    if pingpong:
        entry = epi.tma_input()  # the one M x N input may come through the ping-pong kernel's TMA loader (EPI_TMA)
        tma_input = (entry[0], entry[1]["M"]) if entry else None
        # its M x N outputs may be stored by TMA from the consumers' shared buffers (TMA_STORE)
        tma_outputs = tuple((ptr, strides["M"]) for ptr, strides, _ in epi.tma_outputs)
        parts.append(gluon_template.render_pingpong(kernel_symbol(kernel_base(key), "pingpong"), epi.fn_name,
                                                    epi.params.names(), epi.prefetch, tma_input, scalars,
                                                    tma_outputs))
    if vec is not None:
        parts.append(vec.source)
        parts.append(f"VBLOCK = {VBLOCK}\n")
    source = "\n\n".join(parts)
    prog = Program(key, source, epi, vec)
    with _lock:
        _programs.setdefault(key, prog)
    _write_ir(ep, source, key)
    return _programs[key]


def _write_ir(ep, source: str, key) -> None:
    """The IR text beside the generated source, for `evtorch show` and curious users."""
    try:
        path = kernel_path(source, f"evt_{key[0]}")
        write_text_atomic(path.with_suffix(".ir.txt"), ep.show())
    except OSError:  # a read-only cache dir must not break execution
        pass

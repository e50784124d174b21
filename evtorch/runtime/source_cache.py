"""Generated Triton source -> importable Python module, cached by content hash.

Why files: ``@triton.jit`` reads a kernel's source through ``inspect`` (to hash it and to parse it), so the
source must live in a real ``.py`` file; ``exec`` of a string does not work. Why content hashing: the
same fused epilogue rendered twice (same process or another) maps to the same file and module, so
Triton's own compile cache is reused and nothing is written twice. Why atomic writes: several processes
(data-parallel ranks, pytest-xdist workers) may render the same kernel at the same moment; each writes
a private temp file in the target directory and ``os.replace``s it into place, so a reader never sees a
half-written file and the last writer wins with identical content.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import sys
import tempfile
import threading
from pathlib import Path
from types import ModuleType

from evtorch.runtime import interpreter_fixes, knobs

_MODULE_PREFIX = "evtorch_generated"
_lock = threading.Lock()
_modules: dict[str, ModuleType] = {}


def source_hash(source: str) -> str:
    """Hex SHA-256 of the source text (the module's identity)."""
    if not isinstance(source, str):
        raise TypeError(f"source must be str, got {type(source).__name__}")
    return hashlib.sha256(source.encode("utf-8")).hexdigest()


def kernels_dir() -> Path:
    """Directory holding generated kernel files: EVTORCH_CACHE_DIR/kernels."""
    return knobs.cache_dir() / "kernels"


def _sanitize(name_hint: str) -> str:
    if not isinstance(name_hint, str):
        raise TypeError(f"name_hint must be str, got {type(name_hint).__name__}")
    cleaned = re.sub(r"[^0-9A-Za-z_]", "_", name_hint)[:48].strip("_") or "kernel"
    if cleaned[0].isdigit():
        cleaned = "k_" + cleaned
    return cleaned


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` so that readers see either the old file or the complete new one.

    The temp file is created in the destination directory (``os.replace`` is only atomic within one
    file system), flushed and fsynced before the rename. Parent directories are created.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be str, got {type(text).__name__}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def kernel_path(source: str, name_hint: str) -> Path:
    """Where ``load_module`` stores this source: kernels/<hint>_<hash20>.py."""
    return kernels_dir() / f"{_sanitize(name_hint)}_{source_hash(source)[:20]}.py"


def _ensure_file(path: Path, source: str) -> None:
    """Make ``path`` hold exactly ``source``; rewrite if absent or different (e.g. truncated by hand)."""
    try:
        if path.read_text(encoding="utf-8") == source:
            return
    except (FileNotFoundError, UnicodeDecodeError):
        pass
    write_text_atomic(path, source)


_private_dir: Path | None = None


def _private_kernels_dir() -> Path:
    """A directory of this process's own (created once, removed at exit), for when EVTORCH_CACHE_DIR cannot be
    written: the kernels still need a real file (``inspect``), just not a shared one."""
    global _private_dir
    if _private_dir is None:
        import atexit
        import shutil

        _private_dir = Path(tempfile.mkdtemp(prefix="evtorch-kernels-"))
        atexit.register(shutil.rmtree, _private_dir, ignore_errors=True)
    return _private_dir


def _place(path: Path, source: str) -> Path:
    """``path`` holding ``source``, or, where the cache directory cannot be written (read-only, not a directory,
    a parent missing on a read-only file system), the same file in a private temporary directory, with a warning
    (once a process) naming EVTORCH_CACHE_DIR: a cache that cannot be written must not stop a kernel from running."""
    try:
        _ensure_file(path, source)
        return path
    except OSError as exc:
        first = _private_dir is None
        fallback = _private_kernels_dir() / path.name
        if first:
            import warnings

            warnings.warn(f"{knobs.CACHE_DIR.name}={knobs.cache_dir()}: cannot write generated kernels there "
                          f"({type(exc).__name__}: {exc}); this process writes them under {fallback.parent}",
                          stacklevel=4)
        _ensure_file(fallback, source)
        return fallback


def load_module(source: str, name_hint: str) -> ModuleType:
    """Import generated ``source`` as a module, writing it under EVTORCH_CACHE_DIR/kernels/ first.

    Returns the same module object for the same source within a process. The module is registered in
    ``sys.modules`` under ``evtorch_generated_<file stem>`` so pickling, ``inspect`` and Triton's
    dependency hashing can find it.
    """
    digest = source_hash(source)
    with _lock:
        cached = _modules.get(digest)
        if cached is not None:
            return cached
        if knobs.interpreter_active():  # every generated kernel is imported here first
            interpreter_fixes.apply()
        path = _place(kernel_path(source, name_hint), source)
        module_name = f"{_MODULE_PREFIX}_{path.stem}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot create an import spec for generated kernel file {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(module_name, None)
            raise
        _modules[digest] = module
        return module


def clear_memory_cache() -> None:
    """Forget loaded modules (files stay on disk). For tests that switch EVTORCH_CACHE_DIR."""
    with _lock:
        for module in _modules.values():
            sys.modules.pop(module.__name__, None)
        _modules.clear()

"""The ``evtorch`` command: ``demo``, ``show``, ``tuning``, ``configs``, ``bench``, ``selftest``.

    evtorch demo [--device cpu|cuda] [--size M,N,K] [--dtype f16] [--backend reference|triton]
    evtorch show FILE.py:FUNC --shape M,N[,K] [--batch L] [--input NAME=SPEC ...] [--dot out.svg] [--source]
                 [--backward [WRT]] [--policy save|recompute]
    evtorch tuning [MATCH ...] [--top N] [--json] [--clear]
    evtorch configs --shape M,N,K [--device current|hopper|h100|h200|a100] [--epilogue FILE.py:FUNC] ...
    evtorch bench ...      (benchmarks.run:main)
    evtorch selftest ...   (evtorch.selftest:main)

``main(argv)`` returns the exit code, so tests call it in-process. See docs/cli.md.
"""
from __future__ import annotations

import argparse
import functools
import importlib
import importlib.util
import inspect
import os
import re
import statistics
import sys
from pathlib import Path

import torch

DTYPES = {
    "f16": torch.float16, "float16": torch.float16, "half": torch.float16, "fp16": torch.float16,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "f32": torch.float32, "float32": torch.float32, "float": torch.float32, "fp32": torch.float32,
    "f64": torch.float64, "float64": torch.float64, "double": torch.float64, "fp64": torch.float64,
}


class UsageError(Exception):
    """A bad command line: printed as ``evtorch COMMAND: error: ...`` with exit code 2."""


def parse_dtype(text: str) -> torch.dtype:
    try:
        return DTYPES[text.lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(f"unknown dtype {text!r}; use one of f16, bf16, f32, f64") from None


def parse_ints(text: str, lengths=(2, 3), minimum: int = 0) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.replace("x", ",").split(","))
    except ValueError:
        values = ()
    if len(values) not in lengths or any(v < minimum for v in values):
        want = " or ".join(",".join("MNK"[:n]) for n in lengths)
        what = "non-negative integers" if minimum == 0 else f"integers >= {minimum}"
        raise argparse.ArgumentTypeError(f"expected {want} as {what}, got {text!r}")
    return values


def parse_batch(text: str) -> int:
    """--batch L: a count of problems >= 1 (a negative L reached torch.empty inside tracing as a RuntimeError
    traceback; 0 was taken as unbatched by configs and as an empty batch by show)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a batch count L >= 1, got {text!r}")
    return value


# ---------------------------------------------------------------------------------------------------- show
def load_function(target: str):
    """``path/to/file.py:FUNC`` or ``package.module:FUNC`` -> the function."""
    where, sep, name = target.rpartition(":")
    if not sep or not where or not name:
        raise UsageError(f"expected FILE.py:FUNC or module:FUNC, got {target!r}")
    path = Path(where)
    if where.endswith(".py") or path.exists():
        if not path.is_file():
            raise UsageError(f"no such file: {where}")
        module_name = f"_evtorch_show_{path.stem}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.path.insert(0, str(path.resolve().parent))  # so the file can import its neighbours
        try:
            sys.modules[module_name] = module
            spec.loader.exec_module(module)
        finally:
            sys.path.remove(str(path.resolve().parent))
    else:
        try:
            module = importlib.import_module(where)
        except ModuleNotFoundError as e:
            if e.name and (where == e.name or where.startswith(e.name + ".")):
                raise UsageError(f"{where!r} is neither a file nor an importable module") from None
            raise
    fn = getattr(module, name, None)
    if fn is None:
        defined = sorted(n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_"))
        raise UsageError(f"{where} has no {name!r}; its functions: {', '.join(defined) or 'none'}")
    if not callable(fn):
        raise UsageError(f"{where}:{name} is a {type(fn).__name__}, not a function")
    return fn


def parse_input(text: str, sizes: dict[str, int], dtype: torch.dtype):
    """``NAME=SPEC`` -> (name, example value for ``evt.trace``).

    SPEC is ``scalar`` or a Python float (``0.5``) for a runtime scalar, or a comma-separated shape whose entries
    are integers or the letters M, N, L (``M,N``, ``M,1``, ``N``, ``L,1,N``, ``64``; ``()`` is 0-d), optionally
    followed by ``:DTYPE`` (default: the ``--dtype`` of A and B).
    """
    from .frontend.signature import spec
    name, sep, value = text.partition("=")
    if not sep or not name.isidentifier() or not value:
        raise UsageError(f"--input expects NAME=SPEC (e.g. C=M,N  bias=M,1  alpha=scalar), got {text!r}")
    if value == "scalar":
        return name, 1.0
    if _FLOAT.fullmatch(value):
        return name, float(value)
    shape_text, _, dtype_text = value.partition(":")
    try:
        if dtype_text:
            dtype = parse_dtype(dtype_text)
        dims = [] if shape_text == "()" else shape_text.split(",")
        return name, spec(tuple(sizes[d] if d in sizes else int(d) for d in dims), dtype)
    except (KeyError, ValueError, argparse.ArgumentTypeError):
        raise UsageError(f"--input {text}: cannot read {value!r}; write a shape of integers and M, N, L "
                         "(M,N  M,1  N  L,1,N; () for 0-d), optionally with :DTYPE (M,N:f32), 'scalar', "
                         "or a float like 0.5") from None


_FLOAT = re.compile(r"[-+]?(\d+\.\d*|\.\d+|\d+(\.\d*)?[eE][-+]?\d+|inf|nan)")


def _describe(value) -> str:
    if isinstance(value, float):
        return "scalar"
    return f"{str(value.dtype)[6:]}{list(value.shape)}"


def write_dot(dot: str, path: Path) -> str:
    """Write ``dot`` to ``path``: Graphviz source for ``.dot``/``.gv``, else rendered by the ``graphviz``
    package (format from the suffix). Without graphviz, writes the source beside it and says how to render."""
    fmt = path.suffix.lstrip(".").lower()
    try:
        return _write_dot(dot, path, fmt)
    except OSError as e:  # a directory that does not exist or cannot be written: the argument's fault, named
        raise UsageError(f"--dot {path}: cannot write it ({type(e).__name__}: {e.strerror or e})") from None


def _write_dot(dot: str, path: Path, fmt: str) -> str:
    if fmt in ("dot", "gv", ""):
        path.write_text(dot + "\n")
        return f"wrote Graphviz source to {path} (render it with: dot -Tsvg {path} -o {path.with_suffix('.svg')})"
    try:
        import graphviz
        rendered = graphviz.Source(dot).pipe(format=fmt)
    except Exception as e:  # no package, no `dot` executable, or an unknown format: fall back to the source
        fallback = path.with_suffix(".dot")
        fallback.write_text(dot + "\n")
        why = "the graphviz Python package is not installed" if isinstance(e, ImportError) else \
            f"graphviz could not render {fmt} ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        return (f"{why}; wrote Graphviz source to {fallback} instead. Render it with: "
                f"dot -T{fmt} {fallback} -o {path} (pip install graphviz, and the Graphviz programs: "
                "apt-get install graphviz)")
    path.write_bytes(rendered)
    return f"wrote {path}"


def format_passes(log: list[tuple[str, str]]) -> str:
    """``Epilogue.show()``, but a pass that left the IR as it was prints ``(unchanged)`` instead of the IR."""
    blocks, previous = [], None
    for name, text in log:
        blocks.append(f"== {name} == (unchanged)" if text == previous else f"== {name} ==\n{text}")
        previous = text
    return "\n\n".join(blocks)


def format_codegen_plan(ep, out_dtype: torch.dtype, full: bool = False) -> str:
    """The graph code generation emits for full-size outputs of ``out_dtype`` in this process' fast-math mode
    (``codegen/fastmath.py``: reassociated where values are rounded to 16 bits), or ``(unchanged)`` unless
    ``full``."""
    from .codegen import fastmath

    mode = fastmath.resolve_mode(None)
    graph, emissions = fastmath.plan(ep, out_dtype, mode)
    head = f"== reassociate == (code generation, fast math {mode!r}, outputs in {str(out_dtype).replace('torch.', '')})"
    body = " (unchanged)" if graph is ep.graph and not full else "\n" + str(graph)
    notes = [(f"# hardware approximations: {fastmath.node_names(graph, emissions.fast)}", emissions.fast),
             (f"# exact GPU forms: {fastmath.node_names(graph, emissions.exact)}", emissions.exact)]
    return head + body + "".join("\n" + line for line, nodes in notes if nodes)


def format_backward(ep, wrt: str, out_dtype: torch.dtype, policy: str, source: bool) -> str:
    """The backward evt.gemm builds for ``ep`` (``autodiff.GradPlan``) when every differentiable output gets a
    gradient: what the forward saves, then each backward pass's IR after its passes, its code-generation plan
    (GPU-only emissions) and, with ``source``, its generated source. ``wrt``: 'all' (acc and every floating-point
    tensor input) or a comma-separated list of 'acc' and input names."""
    from .autodiff.plan import GradPlan
    from .autodiff.reverse import composite_operands
    from .ir.node import Node

    floating = [s.name for s in ep.input_specs if s.kind == "tensor" and s.dtype.is_floating_point]
    names = ["acc", *floating] if wrt == "all" else [w.strip() for w in wrt.split(",") if w.strip()]
    unknown = [n for n in names if n != "acc" and n not in floating]
    if unknown or not names:
        raise UsageError(f"--backward {wrt}: expected 'all' or a comma-separated list of acc and floating-point "
                         f"tensor inputs ({', '.join(['acc', *floating])}), got {', '.join(unknown) or 'nothing'}")
    plan = GradPlan(ep, wrt_acc="acc" in names, wrt_inputs=set(names) - {"acc"}, out_dtype=out_dtype, policy=policy)
    head = (f"== backward: gradients of outputs {', '.join(map(str, plan.seeds_all)) or '(none)'} with respect to "
            f"{', '.join(names)} (policy {policy!r}) ==")
    if not plan.requires_grad:
        return head + "\nnothing to differentiate: no floating-point output depends on these"
    program = plan.backward(plan.seeds_all)
    lines = [head, plan.summary()]
    rules = composite_operands(ep.graph, ep.composite_grads)
    if rules:  # which composites the autodiff differentiated by their own rule (autodiff/reverse.py)
        lines.append("# differentiated by their own rules: " + ", ".join(
            f"%{n.name} = {rules[id(n)][0].name}("
            + ", ".join(f"%{a.name}" if isinstance(a, Node) else repr(a) for a in rules[id(n)][1]) + ")"
            for n in ep.graph.nodes if id(n) in rules))
    lines += [f"# {k.param} = input {k.name}" for k in plan.keys if k.param in program.grads or any(
        e.graph.find(k.param) for e in program.epilogues)]
    for i, (p, bep) in enumerate(zip(program.passes, program.epilogues), 1):
        lines += ["", f"== pass {i} of {len(program.passes)}: {bep.name} -> {', '.join(p.outputs)} ==", str(bep.graph),
                  format_codegen_plan(bep, out_dtype)]
        if source:
            lines += ["", bep.source(out_dtype)]
    return "\n".join(lines)


def trace_target(target: str, shape, batch, dtype: torch.dtype, inputs: list[str], debug=None):
    """Trace ``target`` (FILE.py:FUNC or module:FUNC) for an accumulator of ``shape`` (M, N[, K]) and ``batch``,
    its inputs described by ``--input`` texts (a keyword input without one and without a default: full-size).
    Prints the signature line; returns the epilogue. Raises EpilogueError (tracing) or UsageError (inputs)."""
    from . import trace
    from .frontend.signature import epilogue_params, signature_of, spec

    fn = load_function(target)
    fname = getattr(fn, "__name__", type(fn).__name__)  # a functools.partial or a callable object has none
    M, N = shape[:2]
    sizes = {"M": M, "N": N}
    if batch is not None:
        sizes["L"] = batch
    acc_shape = (batch, M, N) if batch is not None else (M, N)
    acc_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    acc_name, names = epilogue_params(fn)
    given = dict(parse_input(t, sizes, dtype) for t in inputs)
    unknown = [n for n in given if n not in names]
    if unknown:
        raise UsageError(f"--input {', '.join(unknown)}: {fname} has no such keyword input; "
                         f"it takes {', '.join(names) or 'none'}")
    try:
        params = signature_of(fn).parameters
    except (TypeError, ValueError):  # a builtin such as torch.tanh: unary (epilogue_params), no defaults to read
        params = {}
    defaulted = [n for n in names if n not in given and params[n].default is inspect.Parameter.empty]
    given.update({n: spec(acc_shape, dtype) for n in defaulted})
    examples = {n: given[n] for n in names if n in given}
    print(f"# {fname}({acc_name}: {_describe(spec(acc_shape, acc_dtype))}"
          + "".join(f", {n}: {_describe(v)}" for n, v in examples.items())
          + f")  M={M} N={N}" + (f" K={shape[2]}" if len(shape) > 2 else "")
          + (f" L={batch}" if batch is not None else ""))
    if defaulted:
        print(f"# full-size by default (describe with --input NAME=SPEC): {', '.join(defaulted)}")
    return trace(fn, debug=debug, **{acc_name: spec(acc_shape, acc_dtype)}, **examples)


def cmd_show(args) -> int:
    from .errors import EpilogueError

    try:
        ep = trace_target(args.target, args.shape, args.batch, args.dtype, args.input, args.debug or None)
    except EpilogueError as e:
        print(f"evtorch show: {args.target}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print()
    print(format_passes(ep.passes_log) if not args.full else ep.show())
    print()
    print(format_codegen_plan(ep, args.dtype, args.full))
    print()
    print("# outputs: " + ", ".join(f"{o.position} ({o.kind})" for o in ep.outputs))
    if args.backward is not None:
        try:
            print()
            print(format_backward(ep, args.backward, args.dtype, args.policy, args.source))
        except UsageError as e:
            print(f"evtorch show: {e}", file=sys.stderr)
            return 2
    if args.dot:
        print(write_dot(ep.to_dot(), Path(args.dot)))
    if args.source:
        try:
            source = ep.source(args.dtype)
        except ImportError as e:
            print(f"evtorch show: --source: code generation is not available in this build ({e})",
                  file=sys.stderr)
            return 1
        print()
        print(source)
    return 0


# ---------------------------------------------------------------------------------------------------- tuning
def format_phases(phases: dict[str, float]) -> str:
    """A tuning's phases in words: ``took 7.10 s: compile 3.20 (GPU loaded 3.15), warm-up 0.30, ...``."""
    words = {"compile": "compile", "warm_up": "warm-up", "first_pass": "first pass", "final": "final"}
    parts = [f"{words[name]} {phases[name]:.2f}" + (f" (GPU loaded {phases['loaded']:.2f})"
                                                     if name == "compile" and phases.get("loaded") else "")
             for name in words if name in phases]
    return f"took {sum(phases.get(name, 0.0) for name in words):.2f} s: " + ", ".join(parts)


def format_records(records: list[dict], top: int | None) -> str:
    """The tuner's records as text: per key its GPU, shape bucket, dtypes, layout and epilogue, then the candidates
    fastest first with their time over the fastest's (``top``: only the first ``top``; None: all)."""
    from .runtime.autotune import key_fields

    blocks = []
    for rec in records:
        f = key_fields(rec["key"])
        head = (f"{f.get('gpu', '?')} | triton {f.get('triton', '?')} | bucket {f.get('mnk', '?')} L {f.get('L', '?')} "
                f"| {f.get('dtypes', '?')} | {f.get('layout', '?')} | epilogue {f.get('epilogue', '?')[:16]}")
        timed = sorted(((ms, name) for name, ms in rec["timings_ms"].items() if ms is not None))
        failed = sorted(name for name, ms in rec["timings_ms"].items() if ms is None)
        best_ms = timed[0][0] if timed else None
        lines = [head] + ([f"  tuned for {rec['label']}"] if rec.get("label") else []) + [
            f"  picked {rec['best'].short()}"]
        if rec.get("phases_s"):  # where the first call's tuning time went (pick_config)
            lines.append("  " + format_phases(rec["phases_s"]))
        if rec.get("final_ms"):  # the finalists' interleaved rounds decided (autotune.FINAL_ROUNDS)
            finals = sorted((statistics.median(ts), name) for name, ts in rec["final_ms"].items())
            lines.append("  by the final's interleaved rounds (median): "
                         + ", ".join(f"{ms:.4f} ms {name}" for ms, name in finals))
        for ms, name in timed[:top]:
            lines.append(f"  {ms:9.4f} ms  x{ms / best_ms:.3f}  {name}")
        if top is not None and len(timed) > top:
            lines.append(f"  ... {len(timed) - top} more (--top 0 lists all)")
        lines += [f"  {'failed':>9s}{'':13s}{name}" for name in failed]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def cmd_tuning(args) -> int:
    import json

    from .runtime import autotune, knobs

    if args.top < 0:
        raise UsageError(f"--top: expected a count of candidates >= 0 (0 lists all), got {args.top}")
    records = [r for r in autotune.stored_records() if all(t in r["key"] for t in args.match)]
    where = knobs.cache_dir() / "autotune"
    if args.clear:
        for rec in records:
            rec["path"].unlink(missing_ok=True)
        autotune.clear_memory_cache()
        print(f"evtorch tuning: removed {len(records)} record(s) from {where}")
        return 0
    if args.json:
        print(json.dumps([{"key": r["key"], "label": r["label"], "fields": autotune.key_fields(r["key"]),
                           "best": r["best"].to_dict(),
                           "timings_ms": r["timings_ms"], "samples_ms": r["samples_ms"], "order": r["order"],
                           "final_ms": r["final_ms"], "phases_s": r["phases_s"],
                           "candidates": {n: c.to_dict() for n, c in r["candidates"].items()}} for r in records],
                         indent=1))
        return 0
    if not records:
        print(f"evtorch tuning: no records under {where}" + (" matching " + " ".join(args.match) if args.match
                                                               else ""))
        return 0
    print(format_records(records, args.top or None))
    return 0


# ------------------------------------------------------------------------------------------------- configs
def _device_for_plan(name: str):
    """The DeviceInfo ``evtorch configs --device`` names: ``current`` (this machine's GPU, else the
    interpreter's or the CPU's), or one of ``configs.NAMED_DEVICES``."""
    from .codegen.configs import NAMED_DEVICES, device_info

    if name == "current":
        return device_info()
    try:
        return NAMED_DEVICES[name]
    except KeyError:
        raise UsageError(f"--device: expected current or one of {sorted(NAMED_DEVICES)}, got {name!r}") from None


def format_config_line(config, M: int, N: int, K: int, L: int, dtype: torch.dtype, info) -> str:
    """One config with how it lays the problem out on ``info`` and the shared memory it is modelled to take."""
    from .codegen.configs import elem_bytes, resident_programs

    g = config.launch_geometry(M, N, K, L, info.num_sms)
    text = f"{config.short()}: {g['tiles']} tiles"
    if "splits" in g:
        rm, rn = g["reduce_tile"]
        text += (f" x {g['splits']} splits = {g['programs']} programs of {g['blocks']} K blocks; reduce on "
                 f"{rm}x{rn}: {g['reduce_programs']} programs, {g['reduce_warps']} warps")
    else:
        text += f", {g['programs']} programs of {g['blocks']} K blocks"
    if info.kind == "cuda":
        text += (f"; {g['programs'] / info.num_sms:.2f} programs an SM ({resident_programs(config, dtype, info)} "
                 f"fit); shared memory {config.smem_bytes(elem_bytes(dtype)) / 1024:.0f} KiB of "
                 f"{info.smem_bytes / 1024:.0f}")
    return text


def cmd_configs(args) -> int:
    from .codegen.policy import candidate_configs, heuristic_choice
    from .runtime.gemm_launch import tma_layout

    M, N, K = args.shape
    L = args.batch or 1
    if min(M, N, K, L) < 1:
        raise UsageError(f"--shape/--batch: expected sizes >= 1, got M,N,K = {M},{N},{K} and L = {L}")
    if args.max < 1:
        raise UsageError(f"--max: expected a count of candidates >= 1, got {args.max}")
    info = _device_for_plan(args.device)
    # contiguous (L,) M x K and K x N operands, judged by the launcher's own rule (shapes only: meta tensors)
    A = torch.empty(((L,) if args.batch else ()) + (M, K), dtype=args.dtype, device="meta")
    tma_ok = not args.no_tma and tma_layout(A, torch.empty(K, N, dtype=args.dtype, device="meta"))[0]
    kw = dict(L=L, tma_ok=tma_ok, allow_tf32=args.tf32)
    copy = f", copies at {info.copy_gbps:.0f} GB/s" if info.copy_gbps else ""
    where = (f"{info.name} ({info.num_sms} SMs, {info.smem_bytes / 1024:.0f} KiB shared memory a block{copy})"
             if info.kind == "cuda" else f"{info.name} (no GPU: the interpreter's small tiles)")
    print(f"evtorch configs: {M}x{N}x{K}" + (f" L={L}" if L > 1 else "") + f" {str(args.dtype).split('.')[-1]} "
          f"on {where}; operands {'TMA-able' if tma_ok else 'not TMA-able'}"
          + ("; TF32 allowed" if args.tf32 else ""))
    ep = None
    if args.epilogue:
        from .errors import EpilogueError

        try:
            ep = trace_target(args.epilogue, (M, N, K), args.batch, args.dtype, args.input)
        except EpilogueError as e:
            print(f"evtorch configs: {args.epilogue}: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
    elif args.input:
        raise UsageError("--input describes the inputs of --epilogue, which is not given")
    heuristic, why = heuristic_choice(M, N, K, args.dtype, info, **kw)
    listed = candidate_configs(M, N, K, args.dtype, info, **kw)  # the tuner's list, as runtime.gemm builds it
    if ep is not None:
        from .codegen.program import build_program
        from .runtime.gemm import candidates_for_program, heuristic_for_program

        prog = build_program(ep, args.dtype)
        adapted = heuristic_for_program(prog, heuristic, N, K, args.dtype, info)
        if adapted != heuristic:
            why += f"; as {ep.name} runs it: policy.epilogue_heuristic"
        heuristic = adapted
        listed = candidates_for_program(prog, listed, args.dtype, info)
        what = f"as {ep.name} can use them: policy.for_epilogue"
    else:
        what = "the heuristic first; an epilogue then adjusts them: policy.for_epilogue, --epilogue"
    print(f"heuristic (EVTORCH_AUTOTUNE=0, and the tuner's fallback): {why}")
    print("  " + format_config_line(heuristic, M, N, K, L, args.dtype, info))
    print(f"tuner's candidates ({min(len(listed), args.max)} of {len(listed)}; {what}):")
    for i, config in enumerate(listed[:args.max], 1):
        print(f"  {i:2d}. " + format_config_line(config, M, N, K, L, args.dtype, info))
    return 0


# ---------------------------------------------------------------------------------------------------- demo
def cmd_demo(args) -> int:
    from .demo import demo
    if args.device and args.device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError("--device cuda: CUDA is not available on this machine (use --device cpu)")
    if args.device and args.device.split(":")[0] not in ("cpu", "cuda"):
        raise UsageError(f"--device {args.device}: the demo runs on cpu or cuda")
    if args.repeat < 0:
        raise UsageError(f"--repeat {args.repeat}: expected 0 or more timed calls")
    on_cpu = not (args.device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
    if args.backend == "triton" and on_cpu and os.environ.get("TRITON_INTERPRET") != "1":
        # Triton reads TRITON_INTERPRET when a kernel is defined, and importing evtorch (torch._dynamo) imports
        # triton: setting it now is too late (every example failed with "Cannot call @triton.jit'd outside of the
        # scope of a kernel", found 2026-11-29), so the command runs again with it set
        sys.stdout.flush()
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], {**os.environ, "TRITON_INTERPRET": "1"})
    return demo(device=args.device, size=args.size, dtype=args.dtype, backend=args.backend, repeat=args.repeat,
                names=args.example, seed=args.seed)


# ---------------------------------------------------------------------------------------------------- bench, selftest
DELEGATES = {"bench": ("benchmarks.run", "the benchmarks (benchmarks/run.py in a source checkout)"),
             "selftest": ("evtorch.selftest", "the GPU selftest (evtorch/selftest.py)")}


def delegate(command: str, argv: list[str]) -> int:
    """Run ``<module>.main`` for ``bench``/``selftest`` with the remaining arguments."""
    module_name, what = DELEGATES[command]
    root = str(Path(__file__).resolve().parents[1])  # a source checkout keeps benchmarks/ beside evtorch/
    if root not in sys.path and os.path.isdir(os.path.join(root, module_name.split(".")[0])):
        sys.path.append(root)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and (module_name == e.name or module_name.startswith(e.name + ".")):
            print(f"evtorch {command}: not available here: module {module_name!r} ({what}) was not found",
                  file=sys.stderr)
            return 2
        raise
    main_fn = getattr(module, "main", None)
    if main_fn is None:
        print(f"evtorch {command}: {module_name} has no main()", file=sys.stderr)
        return 2
    if inspect.signature(main_fn).parameters:
        rc = main_fn(argv)
    else:
        saved, sys.argv = sys.argv, [f"evtorch {command}", *argv]
        try:
            rc = main_fn()
        finally:
            sys.argv = saved
    return rc if isinstance(rc, int) else 0


# ---------------------------------------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    from .examples import EXAMPLES
    parser = argparse.ArgumentParser(prog="evtorch", description="Fused GEMM + epilogue kernels from plain "
                                     "PyTorch functions. See docs/cli.md.")
    parser.add_argument("--version", action="version", version=f"evtorch {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    demo = sub.add_parser("demo", help="run the example epilogues and check them against eager PyTorch",
                          description="Run the example epilogues (evtorch.examples) through evt.gemm on fresh "
                          "random data and check each against fn(A.float() @ B.float(), **inputs).")
    demo.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    # sizes >= 1: the examples' eager references reduce over rows and columns (amax of an empty axis fails)
    demo.add_argument("--size", type=functools.partial(parse_ints, lengths=(3,), minimum=1), metavar="M,N,K",
                      help="problem size (default 4096,4096,4096 on CUDA, 512,384,256 on CPU)")
    demo.add_argument("--dtype", type=parse_dtype, default=torch.float16, help="A and B dtype (default f16)")
    demo.add_argument("--backend", choices=("reference", "triton"),
                      help="evt.gemm backend (default: triton on CUDA, reference on CPU; triton on CPU runs the "
                      "generated kernels in Triton's interpreter)")
    demo.add_argument("--example", action="append", choices=list(EXAMPLES), help="run only this example "
                      "(repeatable)")
    demo.add_argument("--repeat", type=int, default=5,
                      help="timed calls per example, back to back after the checked one (mean reported)")
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(handler=cmd_demo)

    show = sub.add_parser("show", help="print an epilogue's IR after each pass; draw it; print generated source",
                          description="Trace FUNC for the given shapes and print its IR after each optimization "
                          "pass. A keyword input with no --input and no default value is a full-size tensor "
                          "((M, N), or (L, M, N) with --batch).")
    show.add_argument("target", metavar="FILE.py:FUNC", help="the epilogue function (or module:FUNC)")
    show.add_argument("--shape", type=parse_ints, required=True, metavar="M,N[,K]",
                      help="accumulator size (K is shown only: the epilogue does not depend on it)")
    show.add_argument("--batch", type=parse_batch, metavar="L", help="batched: acc is (L, M, N)")
    show.add_argument("--dtype", type=parse_dtype, default=torch.float16,
                      help="A and B dtype, also the default for inputs (default f16)")
    show.add_argument("--input", action="append", default=[], metavar="NAME=SPEC",
                      help="an input's shape: C=M,N  bias=M,1  rb=N  alpha=scalar  (or alpha=0.5)  "
                      "x=M,N:f32 (repeatable)")
    show.add_argument("--dot", metavar="OUT", help="write the optimized DAG: .dot source, or .svg/.png/.pdf "
                      "via the graphviz package")
    show.add_argument("--source", action="store_true", help="print the generated Triton source")
    show.add_argument("--full", action="store_true", help="print the IR after every pass, even when unchanged")
    show.add_argument("--debug", action="store_true", help="run the IR verifier after every pass")
    show.add_argument("--backward", nargs="?", const="all", metavar="WRT",
                      help="also print the backward evt.gemm builds (what the forward saves, each backward pass's "
                      "IR and code-generation plan; with --source its kernels) for gradients with respect to WRT: "
                      "acc and input names, comma-separated (default: acc and every floating-point tensor input)")
    show.add_argument("--policy", choices=("save", "recompute"), default="save",
                      help="with --backward: keep the accumulator for the backward (save) or recompute A @ B")
    show.set_defaults(handler=cmd_show)

    tuning = sub.add_parser("tuning", help="list (or clear) the autotuner's stored results",
                            description="List what the autotuner stored under EVTORCH_CACHE_DIR/autotune: per "
                            "tuning key (GPU, Triton version, shape bucket, dtypes, layout class, epilogue), the "
                            "picked config and every candidate's time. A record is reused by every call whose "
                            "key matches, in any process, until it is cleared.")
    tuning.add_argument("match", nargs="*", help="only keys containing every one of these strings "
                        "(e.g. mnk=8192x4096x1024 'gpu=NVIDIA H100')")
    tuning.add_argument("--top", type=int, default=5, help="candidates listed per key (0: all; default 5)")
    tuning.add_argument("--json", action="store_true", help="print the records as JSON")
    tuning.add_argument("--clear", action="store_true", help="delete the matching records (the next call with "
                        "such a key tunes again)")
    tuning.set_defaults(handler=cmd_tuning)

    configs = sub.add_parser("configs", help="print the configs a GEMM gets: the heuristic's and the tuner's "
                             "candidates, with their tiles, programs, splits and shared memory",
                             description="What the policy (evtorch/codegen/policy.py) chooses for a problem, on "
                             "this machine's GPU or a named one, without running anything.")
    configs.add_argument("--shape", type=functools.partial(parse_ints, lengths=(3,)), required=True,
                         metavar="M,N,K", help="the GEMM: A (M, K) @ B (K, N)")
    configs.add_argument("--batch", type=parse_batch, metavar="L", help="batched: L problems")
    configs.add_argument("--dtype", type=parse_dtype, default=torch.bfloat16, help="A and B dtype (default bf16)")
    configs.add_argument("--device", default="current",
                         help="current (default: this machine's GPU), hopper (or h100, h200) or a100")
    configs.add_argument("--no-tma", action="store_true", help="operands TMA cannot take (the TMA templates off)")
    configs.add_argument("--tf32", action="store_true", help="float32 operands with TF32 allowed")
    configs.add_argument("--max", type=int, default=16, help="the first N candidates (default 16: all the tuner "
                         "times; the bench times 9)")
    configs.add_argument("--epilogue", metavar="FILE.py:FUNC", help="the candidates as this epilogue can use them "
                         "(what the tuner times for it)")
    configs.add_argument("--input", action="append", default=[], metavar="NAME=SPEC",
                         help="with --epilogue: an input's shape, as for show (C=M,N bias=N alpha=scalar ...)")
    configs.set_defaults(handler=cmd_configs)

    for name, (module, what) in DELEGATES.items():
        sub.add_parser(name, help=f"run {what}; arguments are passed on ({module}:main)", add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in DELEGATES:
        return delegate(argv[0], argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except UsageError as e:
        parser.exit(2, f"evtorch {args.command}: error: {e}\n")
    except BrokenPipeError:  # the reader went away (`evtorch show --source | head`): stop quietly, as cat does
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's own flush at exit would raise again
        return 1


if __name__ == "__main__":
    sys.exit(main())

"""Compile generated scan kernels for a GPU target offline (no GPU needed): catches Triton compile errors and
shows resources (registers, shared memory, spills) before any device time is spent.

    python benchmarks/scan_compile_check.py [--arch 90] [--show-ttgir]

Needs Triton's NVIDIA backend (ptxas ships with the wheel); runs with TRITON_INTERPRET unset.
"""
from __future__ import annotations

import argparse
import os
import re
import sys

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from evtorch.scan.api import get_body  # noqa: E402
from evtorch.scan.body import RowSpec  # noqa: E402
from evtorch.codegen.fastmath import exact_forms_active  # noqa: E402
from evtorch.runtime import knobs  # noqa: E402
from evtorch.scan.launch import ScanConfig, heuristic, kernel_for  # noqa: E402

PTR = {torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float64: "*fp64",
       torch.int32: "*i32", torch.int64: "*i64", torch.bool: "*i1"}


def _resources(cubin: bytes) -> str:
    """Registers / stack / spills of the kernel, from cuobjdump (shipped with Triton's NVIDIA backend)."""
    import subprocess
    import tempfile
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        try:
            out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
        except OSError:
            return "resources: cuobjdump not found"
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", out)
    return f"REG={m.group(1)} STACK={m.group(2)} LOCAL={m.group(4)}" if m else out.strip()[-200:]


class FakeCuda:
    type = "cuda"


def compile_group(body, g, cfg: ScanConfig, arch: int, show: bool, k_is_one: bool = False):
    # as on a GPU: the exact GPU forms where the GPU takes them (launch.gpu_forms, without a device to ask)
    kern, fns = kernel_for(body, g, cfg, exact_forms_active(knobs.fast_math_mode(), body.compute_dtype))
    for i, fn in enumerate(fns):
        extra = {}
        if kern.mode == "assoc" and kern.strategy == "segmented":
            extra = {"LB": cfg.window, "SEG": cfg.seg}
        elif kern.mode == "assoc" and kern.strategy in ("lookback", "packed"):
            extra = {"LB": cfg.window, "NSUB": cfg.sub}
        elif kern.mode == "assoc":
            extra = {"SEG": cfg.seg}
            if i == 1:  # scan_carry: segments x lanes
                extra.update({"BLOCK_T": 8, "BLOCK_N": 128})
        _compile_one(body, kern, fn, cfg, arch, show, k_is_one, extra)


def _compile_one(body, kern, fn, cfg, arch, show, k_is_one, extra):
    sig, consts = {}, {}
    for a in kern.args:
        if a[0] == "x":
            sig[f"x{a[1]}"] = PTR[body.inputs[a[1]].dtype]
        elif a[0] in ("init", "out"):
            sig[f"s{a[1]}_{a[0]}"] = PTR[body.states[a[1]].dtype]
        elif a[0] == "post":
            sig[f"p{a[1]}_out"] = PTR[body.post_specs[a[1]].dtype]
        elif a[0] == "sync":
            sig["sync"] = "*i32"
        elif a[0] == "part" and kern.strategy == "packed":
            sig["part"] = "*i64"  # (flag, value) words
        else:
            sig[a[0]] = PTR[body.compute_dtype]
    sig["T"], sig["K"] = "i32", ("constexpr" if k_is_one else "i32")
    if kern.mode == "assoc":
        consts = {"BLOCK_T": cfg.block_t, "BLOCK_N": cfg.block_n, **extra}
        for name in consts:
            sig[name] = "constexpr"
    else:
        sig["BLOCK"] = "constexpr"
        consts = {"BLOCK": cfg.block_n}
    if k_is_one:
        consts["K"] = 1
    attrs = {(i,): [["tt.divisibility", 16]] for i, t in enumerate(sig.values()) if t.startswith("*")}
    src = ASTSource(fn, signature=sig, constexprs=consts, attrs=attrs)  # pointers 16-byte aligned, as at launch
    c = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": cfg.num_warps})
    print(f"  {fn.__name__:12s} {cfg}{' K=1' if k_is_one else ''}: shared={c.metadata.shared} B, "
          f"{_resources(c.asm['cubin'])}")
    if show:
        print(c.asm["ttgir"])
    return c


F32, BF16 = torch.float32, torch.bfloat16


def rows(*shapes, dtype=F32):
    return [RowSpec(f"r{i}", sh, dtype) for i, sh in enumerate(shapes)]


# (name, body, states, inputs, k, post): the kernels benchmarks/scan_bench.py launches, and a few more
CASES = [
    ("cumsum f32", lambda p, x: p + x, rows((1024,)), rows((1024,)), 1, None),
    ("cumsum bf16", lambda p, x: p + x, rows((1024,), dtype=BF16), rows((1024,), dtype=BF16), 1, None),
    ("cummax f32", lambda h, x: torch.maximum(h, x), rows((1024,)), rows((1024,)), 1, None),
    ("cummax bf16", lambda h, x: torch.maximum(h, x), rows((1024,), dtype=BF16), rows((1024,), dtype=BF16), 1, None),
    ("linear f32", lambda h, a, x: a * h + x, rows((1024,)), rows((1024,), (1024,)), 1, None),
    ("linear bf16", lambda h, a, x: a * h + x, rows((1024,), dtype=BF16), rows((1024,), (1024,), dtype=BF16), 1,
     None),
    ("logaddexp f32", lambda h, x: torch.logaddexp(h, x), rows((1024,)), rows((1024,)), 1, None),
    ("logaddexp bf16", lambda h, x: torch.logaddexp(h, x), rows((1024,), dtype=BF16), rows((1024,), dtype=BF16), 1,
     None),
    ("tanh f32", lambda h, a, x: torch.tanh(a * h + x), rows((8192,)), rows((8192,), (8192,)), 1, None),
    ("tanh bf16", lambda h, a, x: torch.tanh(a * h + x), rows((1000,), dtype=BF16),
     rows((1000,), (1000,), dtype=BF16), 1, None),
    ("k=2 lanes", lambda h, x: 0.5 * h + 0.3 * h.at(-2) + 0.1 * x, rows((300,)), rows((300,)), 2, None),
    ("coupled", lambda s1, s2, x: (s1 + x, s2 + s1[..., :1]), rows((300,), (5,)), rows((300,)), 1, None),
    ("post linear", lambda h, a, x, c: a * h + x, rows((300,)), rows((300,), (300,), (300,)), 1,
     lambda h, a, x, c: c * h),
    ("rows (8,33)", lambda h, x: h * 0.9 + x, rows((8, 33)), rows((8, 33)), 1, None),
    ("broadcast a", lambda h, a, x: a * h + x, rows((300,)), rows((1,), (300,)), 1, None),
    ("adjoint", lambda lam, d, g: d * lam + g, rows((64,)), rows((64,), (64,)), 1, None),
    ("int state", lambda h, x: torch.where(x > 0, h + x, h), rows((64,), dtype=torch.int64),
     rows((64,), dtype=torch.int64), 1, None),
    ("post coupled", lambda s1, s2, x: (s1 + x, s2 + s1[..., :1]), rows((30,), (2,)), rows((30,)), 1,
     lambda s1, s2, x: s2 * s1[..., :1]),
]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--show-ttgir", action="store_true")
    ap.add_argument("--only", default=None)
    args = ap.parse_args(argv)
    import scan_bench as B  # the configs the benchmark sweeps and checks
    sweeps = {"cumsum f32": B.ASSOC_SWEEP + B.STRATEGY_CHECKS, "linear f32": B.LINEAR_SWEEP + B.STRATEGY_CHECKS,
              "tanh f32": B.TANH_SWEEP, "cumsum bf16": B.BF16_SWEEP + B.STRATEGY_CHECKS,
              "linear bf16": B.LINEAR_BF16_SWEEP, "logaddexp f32": B.LAE_SWEEP, "cummax f32": B.CUMSUM_LONG_SWEEP}
    failures = 0
    for name, fn, states, inputs, k, post in CASES:
        if args.only and args.only not in name:
            continue
        body = get_body(fn, post, states, inputs, k)
        print(f"{name}: {body}")
        for g in body.groups:
            cfgs = [heuristic(body, g, 65536, FakeCuda(), c) for c in sweeps.get(name, [])]
            for cfg in cfgs or [heuristic(body, g, 65536, FakeCuda(), ScanConfig())]:
                for k_const in (False, True):  # Triton specialises an int argument equal to 1 as a constant
                    try:
                        compile_group(body, g, cfg, args.arch, args.show_ttgir, k_const and k == 1)
                    except Exception as e:  # report and go on: this is a checklist
                        failures += 1
                        print(f"  FAILED {cfg}: {type(e).__name__}: {str(e)[:2000]}")
    print(f"{failures} failure(s)")
    return failures


if __name__ == "__main__":
    sys.exit(1 if main() else 0)

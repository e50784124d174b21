"""Compile generated scan kernels for a GPU target offline (no GPU needed): catches Triton compile errors and
shows resources (registers, shared memory, spills) before any device time is spent.

    python benchmarks/scan_compile_check.py [--arch 90] [--show-ttgir]

Needs Triton's NVIDIA backend (ptxas ships with the wheel); runs with TRITON_INTERPRET unset.
"""
from __future__ import annotations

import argparse
import math
import os
import re
import sys

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from evtorch.scan.api import get_body  # noqa: E402
from evtorch.scan.body import RowSpec  # noqa: E402
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


def compile_group(body, g, cfg: ScanConfig, arch: int, show: bool):
    kern, fn = kernel_for(body, g, cfg)
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
        else:
            sig[a[0]] = PTR[body.compute_dtype]
    sig["T"], sig["K"] = "i32", "i32"
    if kern.mode == "assoc":
        sig["BLOCK_T"] = sig["BLOCK_N"] = "constexpr"
        consts = {"BLOCK_T": cfg.block_t, "BLOCK_N": cfg.block_n}
    else:
        sig["BLOCK"] = "constexpr"
        consts = {"BLOCK": cfg.block_n}
    attrs = {(i,): [["tt.divisibility", 16]] for i, t in enumerate(sig.values()) if t.startswith("*")}
    src = ASTSource(fn, signature=sig, constexprs=consts, attrs=attrs)  # pointers 16-byte aligned, as at launch
    c = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": cfg.num_warps})
    print(f"  {kern.mode:8s} {cfg}: shared={c.metadata.shared} B, {_resources(c.asm['cubin'])}")
    if show:
        print(c.asm["ttgir"])
    return c


CASES = [
    ("cumsum f32", lambda p, x: p + x, [(1024,)], [torch.float32], None),
    ("cumsum bf16", lambda p, x: p + x, [(1024,)], [torch.bfloat16], None),
    ("linear f32", lambda h, a, x: a * h + x, [(1024,), (1024,)], [torch.float32] * 2, "x1"),
    ("cummax", lambda h, x: torch.maximum(h, x), [(1024,)], [torch.float32], None),
    ("logaddexp", lambda h, x: torch.logaddexp(h, x), [(1024,)], [torch.float32], None),
    ("tanh", lambda h, a, x: torch.tanh(a * h + x), [(8192,), (8192,)], [torch.float32] * 2, "x1"),
    ("coupled", lambda s1, s2, x: (s1 + x, s2 + s1[..., :1]), [(64,)], [torch.float32], "coupled"),
]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--show-ttgir", action="store_true")
    ap.add_argument("--only", default=None)
    args = ap.parse_args(argv)
    configs = {"assoc": [ScanConfig(16, 512, 4), ScanConfig(32, 512, 4), ScanConfig(32, 256, 2),
                         ScanConfig(64, 128, 4)]}
    for name, fn, shapes, dtypes, init in CASES:
        if args.only and args.only not in name:
            continue
        xs = [RowSpec(f"x{i}", s, d) for i, (s, d) in enumerate(zip(shapes, dtypes))]
        if init == "coupled":
            states = [RowSpec("s0", shapes[0], dtypes[0]), RowSpec("s1", (8,), dtypes[0])]
        else:
            src = xs[1] if init == "x1" else xs[0]
            states = [RowSpec("s0", src.shape, src.dtype)]
        body = get_body(fn, None, states, xs, 1)
        print(f"{name}: {body}")
        for g in body.groups:
            for cfg in configs.get(g.mode, [heuristic(body, g, 4096, FakeCuda(), ScanConfig())]):
                try:
                    compile_group(body, g, cfg, args.arch, args.show_ttgir)
                except Exception as e:  # report and go on: this is a checklist
                    print(f"  FAILED {cfg}: {type(e).__name__}: {str(e)[:2000]}")


if __name__ == "__main__":
    main()

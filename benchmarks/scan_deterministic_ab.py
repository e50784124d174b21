"""A/B on a GPU: deterministic scans (the three-pass strategy) against the default look-back / segmented ones,
``deterministic=False`` and ``True`` alternated in one process, two rounds each; sums and ``a * h + x`` at the
scan benchmarks' shapes (``triton.testing.do_bench`` medians, which flush L2), and the device's copy bandwidth
for the memory floor. docs/scan.md, "Determinism".

    PYTHONPATH=$PWD OUT=<dir> python benchmarks/scan_deterministic_ab.py
"""
import json
import os

import torch
import triton

import evtorch as evt

LIN = lambda h, a, x: a * h + x  # noqa: E731
ADD = lambda h, x: h + x  # noqa: E731
rows = []
for T, n, dtype in ((65536, 1024, torch.float32), (4096, 8192, torch.float32), (65536, 1024, torch.bfloat16)):
    g = torch.Generator(device="cuda").manual_seed(0)
    X = torch.randn(T, n, device="cuda", generator=g).to(dtype)
    A = (0.5 + 0.5 * torch.rand(T, n, device="cuda", generator=g)).to(dtype)
    for name, fn, args in (("sum", ADD, (X,)), ("lin", LIN, (A, X))):
        row = dict(shape=f"{T}x{n}", dtype=str(dtype), fn=name)
        for det in (False, True, False, True):
            def call():
                return evt.scan(fn, *args, init=X[:1], deterministic=det)
            call()
            ms = triton.testing.do_bench(call, warmup=25, rep=200, return_mode="median")
            row.setdefault("det" if det else "default", []).append(round(ms * 1000, 1))
        rows.append(row)
        print(row, flush=True)
x = torch.empty(2 ** 28, dtype=torch.uint8, device="cuda")
y = torch.empty_like(x)
copy_gbs = 2 * x.numel() / triton.testing.do_bench(lambda: y.copy_(x), return_mode="median") / 1e6
print("copy GB/s", copy_gbs)
json.dump(dict(device=torch.cuda.get_device_name(), copy_gbs=copy_gbs, rows=rows),
          open(os.path.join(os.environ["OUT"], "scan_deterministic_ab.json"), "w"), indent=1)

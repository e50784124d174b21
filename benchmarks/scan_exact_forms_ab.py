"""A/B on a GPU: scans' exact GPU forms (``tlmath.tanh_gpu``) against the portable tanh, ``EVTORCH_FAST_MATH``
``never`` and ``auto`` alternated in one process, three rounds; whether the two give the same bits; the lane-wise
``tanh(a * h + x)`` forward at three shapes and forward + backward at one (``triton.testing.do_bench`` medians, which
flush L2). docs/scan.md, "The exact GPU forms in scans".

    PYTHONPATH=$PWD OUT=<dir> python benchmarks/scan_exact_forms_ab.py
"""
import json
import os

import torch
import triton

import evtorch as evt
TANH = lambda h, a, x: torch.tanh(a * h + x)  # noqa: E731
res = {"device": torch.cuda.get_device_name(), "rows": []}
g = torch.Generator(device="cuda").manual_seed(0)
for T, n in ((4096, 8192), (16384, 1024), (4096, 131072)):
    A = torch.rand(T, n, device="cuda", generator=g)
    X = torch.randn(T, n, device="cuda", generator=g)
    outs, times = {}, {"never": [], "auto": []}
    for r in range(3):
        for mode in ("never", "auto"):
            os.environ["EVTORCH_FAST_MATH"] = mode
            outs[mode] = evt.scan(TANH, A, X, init=X[:1])
            times[mode].append(triton.testing.do_bench(lambda: evt.scan(TANH, A, X, init=X[:1]), warmup=25, rep=200,
                                                       return_mode="median") * 1e3)
    same = torch.equal(outs["never"], outs["auto"])
    row = dict(T=T, n=n, never_us=times["never"], auto_us=times["auto"], bit_identical=same,
               ratio=min(times["auto"]) / min(times["never"]), ns_per_step_auto=min(times["auto"]) * 1e3 / T)
    res["rows"].append(row)
    print(json.dumps(row), flush=True)
# backward of the lane-wise tanh scan too
T, n = 4096, 8192
A = torch.rand(T, n, device="cuda", generator=g).requires_grad_()
X = torch.randn(T, n, device="cuda", generator=g)
for r in range(2):
    for mode in ("never", "auto"):
        os.environ["EVTORCH_FAST_MATH"] = mode
        def step():
            out = evt.scan(TANH, A, X, init=X[:1])
            return torch.autograd.grad(out, A, torch.ones_like(out))[0]
        ga = step()
        t = triton.testing.do_bench(step, warmup=5, rep=100, return_mode="median") * 1e3
        print(json.dumps(dict(what="fwd+bwd", mode=mode, us=t, gsum=float(ga.double().sum()))), flush=True)
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "scan_ab.json"), "w"), indent=1)

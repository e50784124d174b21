"""Two questions about the tile schedule (issue 4), answered with fixed configs in the bench's interleaved rounds.

**Waves** (``--mode waves``, the default): how much the last, partial wave of tiles costs. At 8192 x 8192 the
ping-pong kernel's 4096 tiles of 128 x 128 fill 31.03 waves of 132 SMs (H100), so 4 programs run a 32nd tile while
128 idle; at 8192 x 4096, 2048 tiles fill 15.52 waves. If the tail cost what tile counting says, a shape with
exactly 31 (15) waves would run ~3% more TFLOP/s than the issue's shape, and a stream-K or split-K tail could win
that back. Shapes: the issue's two and neighbours with whole waves.

**Groups** (``--mode groups``): the grouped tile order's GROUP_M. A wave of 132 programs covers GROUP_M rows of
tiles by 132 / GROUP_M columns; over the whole product B's column blocks are read from DRAM once per group of rows
(at 8192 x 8192 x 4096: 512 MB at GROUP_M = 8, 256 MB at 16) while the group's A blocks must stay in L2 (8 MB at 8,
16 MB at 16); and the tiles a wave stores are GROUP_M bands of 132 / GROUP_M tiles (whole rows of the output when
132 / GROUP_M covers N). Per row of a bench JSON (``--picks``, default the 02:41 H100 bench): its picked config
with GROUP_M in ``--groups``, the large shape at ``--groups-large``, each row's variants and cuBLAS timed in one
set of rounds.

    PYTHONUNBUFFERED=1 python -m benchmarks.schedule_probe --out $OUT [--mode waves|groups]

Waves: cuBLAS and evtorch calls with fixed configs (ping-pong picks of the 02:41 H100 bench), all timed in one set
of rounds per shape; TFLOP/s. Writes schedule_<mode>.json and its log. ``--dry-run``: the Triton interpreter at
tiny sizes (checks the script only).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.experiment import parser  # noqa: E402

T0 = time.time()

WAVE_SHAPES = ((8192, 8192, 4096), (7936, 8448, 4096), (8448, 8448, 4096),
               (8192, 4096, 1024), (8448, 3840, 1024), (8448, 4096, 1024))


def _pingpong(group: int, subtile, stages: int = 5):
    from evtorch.codegen.configs import GemmConfig

    return GemmConfig("pingpong", 128, 128, 64, group, 1, 4, stages,
                      (("EPILOGUE_SUBTILE", subtile), ("PREFETCH", 0)))


def _contenders(cuda: bool) -> dict:
    """Waves mode: name -> (workload or None for the plain GEMM, config or None for the tuner's pick)."""
    from evtorch.codegen.configs import GemmConfig

    if not cuda:
        return {"identity": (None, None), "lincomb_relu": ("lincomb_relu", None)}
    return {"identity": (None, GemmConfig("persistent_tma", 128, 256, 64, 8, 1, 8, 3, (("EPILOGUE_SUBTILE", True),))),
            "lincomb_relu": ("lincomb_relu", _pingpong(8, 4)),
            "dgelu_bgrad": ("dgelu_bgrad", _pingpong(8, True))}


def _group_rows(args, cuda: bool) -> list:
    """Groups mode: ((M, N, K), workload, {name: config}) per bench row, its pick at each GROUP_M."""
    import dataclasses
    import json

    from evtorch.codegen.configs import GemmConfig

    if not cuda:
        return [((64, 64, 32), "lincomb_relu", {f"g{g}": GemmConfig("portable", 32, 32, 32, g, 1, 4, 1)
                                                 for g in (1, 8)})]
    rows = []
    for row in json.loads(Path(args.picks).read_text())["rows"]:
        shape = tuple(row["shape"])
        if args.shapes and "x".join(map(str, shape)) not in args.shapes:
            continue
        groups = args.groups if shape[2] <= 1024 else args.groups_large
        cfg = GemmConfig.from_dict(row["config_dict"])
        rows.append((shape, row["workload"], {f"g{g}": dataclasses.replace(cfg, GROUP_M=g) for g in groups}))
    return rows


def _groups(b, args, cuda: bool, dev: str) -> None:
    import torch

    import evtorch as evt
    from benchmarks.workloads import bench_workload
    from evtorch.examples import operands

    operands_of = {}
    for (M, N, K), workload, configs in _group_rows(args, cuda):
        if b.time_left() < 30:
            b.log("SKIP", workload, (M, N, K), "deadline")
            continue
        if (M, N, K) not in operands_of:
            torch.manual_seed(0)
            operands_of.clear()
            operands_of[(M, N, K)] = operands(M, N, K, dev, torch.bfloat16 if cuda else torch.float16)
        A, B = operands_of[(M, N, K)]
        fn, make_inputs = bench_workload(workload)
        inputs = make_inputs(M, N, dev, A.dtype)
        fns = {"cublas": lambda: torch.matmul(A, B)}
        for name, cfg in configs.items():
            fns[name] = (lambda cfg=cfg: evt.gemm(A, B, fn, config=cfg, **inputs))
            fns[name]()
        if cuda:
            torch.cuda.synchronize()
        times = b.paired(fns)
        row = {"M": M, "N": N, "K": K, "workload": workload,
               "configs": {k: c.short() for k, c in configs.items()},
               "ms": {k: v[0] for k, v in times.items()}, "rounds_ms": {k: v[1] for k, v in times.items()}}
        b.results["rows"].append(row)
        cub = row["ms"]["cublas"]
        b.log(f"{M}x{N}x{K} {workload:15s} " + " | ".join(f"{k} {v:.4f} ms x{v / cub:.3f}"
                                                        for k, v in row["ms"].items()))
        b.save()


def main(argv=None) -> int:
    ap = parser("schedule_probe", 400, 0, 1)
    ap.add_argument("--mode", choices=("waves", "groups"), default="waves")
    ap.add_argument("--picks", default=str(Path(__file__).parent / "results" / "bench_h100_run20261127_0241.json"))
    ap.add_argument("--groups", type=lambda s: [int(g) for g in s.split(",")], default=[1, 2, 4, 8])
    ap.add_argument("--groups-large", type=lambda s: [int(g) for g in s.split(",")], default=[4, 8])
    ap.add_argument("--shapes", type=lambda s: s.split(","), default=None, help="groups mode: only these MxNxK")
    args = ap.parse_args(argv)
    import os

    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    import evtorch as evt
    from benchmarks.harness import Harness
    from benchmarks.workloads import bench_workload
    from evtorch.examples import operands

    cuda = torch.cuda.is_available() and not args.dry_run
    results = {"mode": args.mode, "rows": []}
    b = Harness(args, f"schedule_{args.mode}", results, cuda=cuda, warmup_ms=25, rep_ms=250 if cuda else 1, t0=T0)
    dev = "cuda" if cuda else "cpu"
    sms = torch.cuda.get_device_properties(0).multi_processor_count if cuda else 4
    results["device"] = torch.cuda.get_device_name(0) if cuda else "cpu"
    b.log("device", results["device"], "sms", sms, "mode", args.mode)
    if args.mode == "groups":
        _groups(b, args, cuda, dev)
        return b.finish()
    shapes = WAVE_SHAPES if cuda else ((64, 64, 32), (64, 96, 32))
    contenders = _contenders(cuda)
    for M, N, K in shapes:
        torch.manual_seed(0)
        A, B = operands(M, N, K, dev, torch.bfloat16 if cuda else torch.float16)
        fns = {"cublas": lambda: torch.matmul(A, B)}
        inputs = {}
        for name, (workload, cfg) in contenders.items():
            if workload is None:
                fns[name] = (lambda cfg=cfg: evt.gemm(A, B, config=cfg))
            else:
                fn, make_inputs = bench_workload(workload)
                if workload not in inputs:
                    inputs[workload] = make_inputs(M, N, dev, A.dtype)
                fns[name] = (lambda fn=fn, kw=inputs[workload], cfg=cfg: evt.gemm(A, B, fn, config=cfg, **kw))
            fns[name]()
        if cuda:
            torch.cuda.synchronize()
        times = b.paired(fns)
        tiles = -(-M // 128) * -(-N // 128)
        row = {"M": M, "N": N, "K": K, "tiles": tiles, "waves_128x128": tiles / sms,
               "ms": {k: v[0] for k, v in times.items()}, "rounds_ms": {k: v[1] for k, v in times.items()},
               "tflops": {k: 2 * M * N * K / v[0] / 1e9 for k, v in times.items()}}
        results["rows"].append(row)
        b.log(f"{M}x{N}x{K} tiles {tiles} waves {tiles / sms:.2f} | " +
              " | ".join(f"{k} {v:.4f} ms {row['tflops'][k]:.0f} TF/s" for k, v in row["ms"].items()))
        b.save()
    return b.finish()


if __name__ == "__main__":
    raise SystemExit(main())

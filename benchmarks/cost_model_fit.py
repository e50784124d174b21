"""Fit the split-K cost model (``evtorch.codegen.policy.cost_steps``) to kernel timings, and say what its picks cost.

    python -m benchmarks.cost_model_fit [--runs FILE.json ...] [--per-split] [--cv]

The model of a config at a problem: the busiest SM's K steps of a 128x128x64 tile (``policy.cost_steps`` with a step
cost of 1) times the step cost of the config's tile and template, plus, for a split, a fixed cost, a cost per MB of
float32 partials, and (``--per-split``) a cost per split: the reduce kernel's programs read the splits' partials one
after another, which the MB term prices as bandwidth only. Under the main loop's steps lies the memory floor (the
operands' bytes at the copy bandwidth, ``policy.memory_floor_steps``): the fit prices the main loop's steps and so
leaves out the timings the floor sets (``memory_bound``: 46 of the default runs' 412), and the picks are scored
with it (``--copy-gbps``; 0 scores them without it). Every term is linear in the unknowns (microseconds a step
of each tile class, the fixed cost, a MB, a split), so the fit is a weighted linear least squares on relative error
(weights 1 / measured time), over every identity timing by graph replay (``graph_ms``) in ``--runs`` of configs the
model ranks (the few-rows tiles, the TMA split tiles). It prints the constants in the policy's units (steps of the
split 128x128 tile), the rms relative error, and per shape the heuristic's pick with the fitted constants against
the fastest config timed there; ``--cv`` refits without each run in turn and scores the runs it left out.

Default runs: every ``benchmarks/results/skinny_h200_20261128_*.json`` (H200, 2026-11-28).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RESULTS = Path(__file__).resolve().parent / "results"
# the runs since the split kernel's current main loops (07:22): earlier ones timed other kernels
DEFAULT_RUNS = ["skinny_h200_20261128_0722_splitk_main_loops.json", "skinny_h200_20261128_0943_splitk_threshold.json",
                "skinny_h200_20261128_1208_below_threshold.json", "skinny_h200_20261128_1217_split_model.json",
                "skinny_h200_20261128_1223_split_model_heldout.json", "skinny_h200_20261128_1241_few_rows_128.json",
                "skinny_h200_20261128_1244_few_rows_128_check.json", "skinny_h200_20261128_1500_128_rows.json"]


def _h200(copy_gbps: float | None = None):
    """The H200 the runs were timed on; ``copy_gbps`` (GB/s) replaces its copy bandwidth (0: no memory floor)."""
    from evtorch.codegen.configs import NAMED_DEVICES
    info = NAMED_DEVICES["h200"]
    return info if copy_gbps is None else dataclasses.replace(info, copy_gbps=copy_gbps)


def load(runs: list[str]) -> list[dict]:
    """One record per timing the model can rank: run, shape, config name, its GemmConfig, graph_ms (the fastest of
    repeats in one run)."""
    from benchmarks.skinny_probe import configs
    from evtorch.codegen import policy
    from evtorch.codegen.configs import GemmConfig

    info = _h200()
    # the configs the heuristic ranks: the few-rows tiles and the split tiles over TMA loads (any split count)
    ranked = set(policy._persistent_space(torch.bfloat16, (policy._FEW_ROWS_128,) + policy._FEW_ROWS_16))
    for bn, stages in ((128, 6), (256, 4)):
        base = GemmConfig("splitk", 128, bn, 64, 8, 2, 8, stages, (("TMA_LOADS", True),))
        ranked |= {policy._fit_stages(dataclasses.replace(base, SPLIT_K=k), torch.bfloat16, info) for k in range(2, 17)}
    out = []
    for run in runs:
        rows = json.loads((RESULTS / run).read_text())["rows"]
        for row in rows:
            if row["workload"] != "identity":
                continue
            M, N, K = row["shape"]
            named = configs(M, N, K)
            for name, v in row["configs"].items():
                cfg = named.get(name)
                if cfg is None or "graph_ms" not in v:
                    continue
                if cfg.template == "splitk" and not cfg.flag("TMA_LOADS"):
                    continue
                cfg = policy._fit_stages(cfg, torch.bfloat16, _h200())
                if cfg not in ranked:  # other rings or warp counts of the same tiles are not what the model prices
                    continue
                out.append(dict(run=run, shape=(M, N, K), name=name, config=cfg, ms=v["graph_ms"]))
    return out


def _classes() -> list[tuple]:
    from evtorch.codegen import policy
    return list(policy._STEP_COST)


@contextmanager
def constants(step_cost: dict, fixed: float, per_mb: float, per_split: float):
    """The policy's cost constants replaced for the duration (the heuristic then picks with them)."""
    from evtorch.codegen import policy
    saved = (dict(policy._STEP_COST), policy.SPLIT_FIXED_STEPS, policy.PARTIAL_STEPS_PER_MB,
             policy.REDUCE_STEPS_PER_SPLIT)
    policy._STEP_COST.update(step_cost)
    policy.SPLIT_FIXED_STEPS, policy.PARTIAL_STEPS_PER_MB, policy.REDUCE_STEPS_PER_SPLIT = fixed, per_mb, per_split
    try:
        yield
    finally:
        policy._STEP_COST.clear()
        policy._STEP_COST.update(saved[0])
        policy.SPLIT_FIXED_STEPS, policy.PARTIAL_STEPS_PER_MB, policy.REDUCE_STEPS_PER_SPLIT = saved[1:]


def features(rec: dict, per_split: bool) -> list[float]:
    """The record's design row: busiest-SM steps under each tile class, then the split's indicator, its MB of
    partials and (``per_split``) its split count. The main loop's MMA work only (``policy.main_loop_steps``): the
    memory floor is not linear in the unknowns, and ``behind`` scores the picks with it."""
    from evtorch.codegen import policy
    cfg, (M, N, K) = rec["config"], rec["shape"]
    with constants({k: 1.0 for k in policy._STEP_COST}, 0.0, 0.0, 0.0):
        steps = policy.main_loop_steps(cfg, M, N, K, 1, torch.bfloat16, _h200())
    row = [steps if (cfg.template, cfg.BLOCK_M, cfg.BLOCK_N) == c else 0.0 for c in _classes()]
    split = max(cfg.SPLIT_K, 1)
    mb = split * M * N * 4 / 1e6 if split > 1 else 0.0
    row += [1.0 if split > 1 else 0.0, mb]
    if per_split:
        row.append(float(split) if split > 1 else 0.0)
    return row


def memory_bound(rec: dict) -> bool:
    """Whether the H200's memory floor is over the record's main-loop steps with the policy's constants: its time
    says how fast its operands stream in, not what its tile's steps cost, so the fit leaves it out."""
    from evtorch.codegen import policy
    cfg, (M, N, K), info = rec["config"], rec["shape"], _h200()
    return (policy.memory_floor_steps(M, N, K, 1, torch.bfloat16, info)
            > policy.main_loop_steps(cfg, M, N, K, 1, torch.bfloat16, info))


def fit(records: list[dict], per_split: bool) -> dict:
    """Weighted least squares on relative error, over the records whose time the memory floor does not set
    (``memory_bound``); the constants in steps of the split 128x128 tile."""
    import numpy as np
    records = [r for r in records if not memory_bound(r)]
    X = np.array([features(r, per_split) for r in records])
    y = np.array([r["ms"] * 1e3 for r in records])  # us
    w = 1.0 / y
    coef, *_ = np.linalg.lstsq(X * w[:, None], y * w, rcond=None)
    pred = X @ coef
    rms = float(np.sqrt(np.mean(((pred - y) / y) ** 2)))
    classes = _classes()
    step_us = coef[classes.index(("splitk", 128, 128))]
    step_cost = {c: float(coef[i] / step_us) for i, c in enumerate(classes) if abs(coef[i]) > 0}
    # classes without timings keep the policy's value
    from evtorch.codegen import policy
    for c in classes:
        if not any((r["config"].template, r["config"].BLOCK_M, r["config"].BLOCK_N) == c for r in records):
            step_cost[c] = policy._STEP_COST[c]
    n = len(classes)
    return dict(step_us=float(step_us), step_cost=step_cost, fixed=float(coef[n] / step_us),
                per_mb=float(coef[n + 1] / step_us), per_split=float(coef[n + 2] / step_us) if per_split else 0.0,
                rms=rms, n=len(records))


def behind(records: list[dict], model: dict, copy_gbps: float | None = None) -> dict:
    """Shape -> the heuristic's pick (with ``model``'s constants, on an H200 with ``copy_gbps`` if given) over the
    fastest config timed, for shapes whose pick was timed (None where it was not)."""
    from evtorch.codegen.policy import heuristic_config
    by_shape: dict = {}
    for r in records:
        by_shape.setdefault(r["shape"], []).append(r)
    out = {}
    with constants(model["step_cost"], model["fixed"], model["per_mb"], model["per_split"]):
        for (M, N, K), recs in by_shape.items():
            pick = heuristic_config(M, N, K, torch.bfloat16, _h200(copy_gbps), tma_ok=True)
            times = [r["ms"] for r in recs if r["config"] == pick]
            out[(M, N, K)] = min(times) / min(r["ms"] for r in recs) if times else None
    return out


def geomean(values) -> float:
    values = [v for v in values if v is not None]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def current() -> dict:
    from evtorch.codegen import policy
    return dict(step_cost=dict(policy._STEP_COST), fixed=policy.SPLIT_FIXED_STEPS, per_mb=policy.PARTIAL_STEPS_PER_MB,
                per_split=policy.REDUCE_STEPS_PER_SPLIT)


def report(label: str, b: dict) -> None:
    timed = [v for v in b.values() if v is not None]
    print(f"{label}: {len(timed)} of {len(b)} shapes' picks timed; behind the fastest: geomean {geomean(timed):.4f}, "
          f"max {max(timed):.3f}, > 1.5% at {sum(v > 1.015 for v in timed)}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", nargs="*", default=DEFAULT_RUNS)
    ap.add_argument("--per-split", action="store_true", help="fit a cost per split too")
    ap.add_argument("--cv", action="store_true", help="leave-one-run-out: refit without each run, score it")
    ap.add_argument("--shapes", action="store_true", help="print each shape's pick quality")
    ap.add_argument("--copy-gbps", type=float, default=None,
                    help="score the picks with this copy bandwidth (GB/s) under the memory floor; 0: no floor "
                         "(default: the H200's measured one)")
    args = ap.parse_args(argv)
    bw = args.copy_gbps
    records = load(args.runs)
    model = fit(records, args.per_split)
    print(f"{model['n']} timings from {len(args.runs)} runs ({len(records) - model['n']} memory-bound ones left "
          f"out); rms relative error {model['rms']:.3f}; a step "
          f"{model['step_us']:.3f} us")
    print("  step cost: " + ", ".join(f"{t}/{m}x{n} {v:.2f}" for (t, m, n), v in model["step_cost"].items()))
    print(f"  split fixed {model['fixed']:.1f} steps, {model['per_mb']:.2f} a MB, {model['per_split']:.2f} a split")
    report("the policy's constants", behind(records, current(), bw))
    b = behind(records, model, bw)
    report("the fitted constants  ", b)
    if args.shapes:
        cur = behind(records, current(), bw)
        for s in sorted(b):
            nan = float("nan")
            print(f"  {'x'.join(map(str, s)):18s} policy {cur[s] or nan:.3f}  fitted {b[s] or nan:.3f}")
    if args.cv:
        left_out: dict = {}
        for run in args.runs:
            train = [r for r in records if r["run"] != run]
            test = [r for r in records if r["run"] == run]
            if not test:
                continue
            m = fit(train, args.per_split)
            for s, v in behind(test, m, bw).items():
                left_out.setdefault(s, []).append(v)
        worst = {s: max((x for x in v if x is not None), default=None) for s, v in left_out.items()}
        report("left-one-run-out       ", worst)
    return 0


if __name__ == "__main__":
    sys.exit(main())

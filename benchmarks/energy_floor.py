"""An energy floor per bench row: how close to cuBLAS a fused kernel can come on a board held at its power cap.

Every kernel of the bench, cuBLAS included, runs at the board's power limit (docs/benchmarks.md, "Power"): the
SM clock is what the power budget allows, so a kernel's time is its energy over the power it may draw. A fused
GEMM + epilogue does the GEMM's work and moves its epilogue's extra bytes (M x N inputs read, outputs beyond the
GEMM's one written) through DRAM, L2 and the SMs; if those bytes cost what they cost in a plain device copy, then
at the cap

    t_fused >= (E_gemm + extra_bytes * e_byte) / (P_cap - P_static)

with ``E_gemm`` = (P_cublas - P_static) * t_cublas the GEMM's dynamic energy (cuBLAS's, sustained), ``e_byte`` =
(P_copy - P_static) * t_copy / copy_bytes the dynamic energy of a copied byte, and ``P_static`` the board's power
with its clocks up and almost nothing switching (one spinning thread block). Dividing by t_cublas gives a floor on
fused / cuBLAS. It is an estimate, not a proof, and leans low where it can: it charges the epilogue nothing for its
arithmetic, its reductions or the extra L2 traffic of a smaller tile, and it takes the static power at the spin's
clock, which is higher than the GEMM's (more leakage, so a smaller dynamic budget for the copy's bytes). It leans
high in one respect: a kernel slowed to a lower clock also runs at a lower voltage and spends less energy per
FLOP than cuBLAS at its clock; a few percent at the clocks measured (1.4-1.8 GHz against cuBLAS's ~1.5).

The probe's own rows say how much energy each fused kernel spends beyond its bytes: ``beyond_bytes_mj`` is its
measured dynamic energy per launch minus cuBLAS's and minus its extra bytes at ``e_byte``.

    python -m benchmarks.power_probe --out DIR --from-bench bench.json --baselines --seconds 2
    python -m benchmarks.energy_floor bench.json DIR/power.json [--md]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

# the targets (fused / cuBLAS) by shape; rows of other shapes get none
TARGETS = {(8192, 8192, 4096): 1.05, (8192, 4096, 1024): 1.15}


def _one(rows: list[dict], job: str) -> dict:
    found = [r for r in rows if r["job"] == job and r.get("power_w") is not None]
    if not found:
        raise ValueError(f"power JSON: no {job!r} row (run power_probe with --baselines)")
    return found[-1]


def energy_model(power: dict, static_w: float | None = None) -> dict:
    """The model's constants from a power_probe JSON: cap, static power, copy energy per byte (pJ). ``static_w``
    replaces the measured static power (the spinning block's), to see how much the floors depend on it."""
    from benchmarks.power_probe import LIMITS_KEY, is_copy

    rows = power["rows"]
    cap = float(str(power[LIMITS_KEY]).split(",")[0])
    spin, copy, idle = _one(rows, "spin"), _one(rows, "copy"), _one(rows, "idle")
    static = spin["power_w"] if static_w is None else float(static_w)
    # the dynamic energy per byte of every copy size the probe ran (``copy:MIB`` jobs too, for a look at how much
    # it moves); the model takes the ``copy`` job's
    per_copy = {r["job"]: (r["power_w"] - static) * r["ms_per_launch"] * 1e-3 / r["bytes_per_launch"] * 1e12
                for r in rows if is_copy(r["job"]) and r.get("power_w") is not None}
    return {"cap_w": cap, "static_w": static, "idle_w": idle["power_w"], "copy_w": copy["power_w"],
            "copy_GBps": copy["bytes_per_launch"] / (copy["ms_per_launch"] * 1e-3) / 1e9,
            "e_byte_pj": per_copy[copy["job"]],
            "e_byte_pj_per_copy": per_copy, "spin_mhz": spin["sm_mhz"], "copy_mhz": copy["sm_mhz"],
            "static_given": static_w is not None}


def gemm_bytes(M: int, N: int, K: int, elem: int = 2) -> int:
    """The bare GEMM's fewest bytes: A and B read once, the M x N product written once."""
    return (M * K + K * N + M * N) * elem


def floors(bench: dict, power: dict, static_w: float | None = None) -> tuple[dict, list[dict]]:
    """(model, one dict per bench row with a probe row): extra bytes over the bare GEMM, the energy floor on
    fused / cuBLAS, the probe's sustained ratio and energies, the bench's ratio and the issue's target."""
    model = energy_model(power, static_w)
    static, cap, e_byte = model["static_w"], model["cap_w"], model["e_byte_pj"] * 1e-12
    probe = power["rows"]
    out = []
    for row in bench.get("rows", []):
        shape = tuple(row["shape"])
        mine = [r for r in probe if r["job"] == row["workload"] and tuple(r.get("shape") or ()) == shape]
        cub = [r for r in probe if r["job"] == "cublas" and tuple(r.get("shape") or ()) == shape]
        if not mine or not cub or "bytes" not in row:
            continue
        r = mine[-1]
        t_cub = statistics.median(c["ms_per_launch"] for c in cub) * 1e-3
        p_cub = statistics.median(c["power_w"] for c in cub)
        extra = row["bytes"] - gemm_bytes(*shape)
        e_gemm = (p_cub - static) * t_cub
        floor = (e_gemm + extra * e_byte) / ((cap - static) * t_cub)
        t_row = r["ms_per_launch"] * 1e-3
        e_row = (r["power_w"] - static) * t_row
        target = TARGETS.get(shape)
        out.append({
            "workload": row["workload"], "shape": list(shape), "extra_MB": extra / 1e6,
            "floor_ratio": floor, "target": target,
            "floor_over_target": (floor > target) if target is not None else None,
            "sustained_ratio": t_row / t_cub, "bench_ratio": row.get("evt_vs_cublas"),
            "power_w": r["power_w"], "sm_mhz": r["sm_mhz"], "cublas_power_w": p_cub,
            "dynamic_mj": e_row * 1e3, "cublas_dynamic_mj": e_gemm * 1e3,
            "beyond_bytes_mj": (e_row - e_gemm - extra * e_byte) * 1e3,
        })
    return model, out


def attach_floors(rows: list[dict], found: list[dict]) -> None:
    """Give each bench row in ``rows`` its ``energy_floor`` (and ``beyond_bytes_mj`` where known) from ``found``
    (``floors``' rows, or those of an ``--out`` JSON), matched by workload and shape; rows without one keep none."""
    by_row = {(f["workload"], tuple(f["shape"])): f for f in found}
    for row in rows:
        f = by_row.get((row.get("workload"), tuple(row.get("shape") or ())))
        if f is not None:
            row["energy_floor"] = f["floor_ratio"]
            if "beyond_bytes_mj" in f:
                row["beyond_bytes_mj"] = f["beyond_bytes_mj"]


def render(model: dict, rows: list[dict], md: bool = False) -> str:
    static = ("given" if model.get("static_given") else f"one spinning block, {model['spin_mhz']:.0f} MHz")
    head = (f"cap {model['cap_w']:.0f} W, static ({static}) "
            f"{model['static_w']:.0f} W, idle {model['idle_w']:.0f} W; copy {model['copy_GBps']:.0f} GB/s at "
            f"{model['copy_w']:.0f} W ({model['copy_mhz']:.0f} MHz): {model['e_byte_pj']:.0f} pJ per byte moved"
            + "".join(f"; {job} {pj:.0f} pJ" for job, pj in model.get("e_byte_pj_per_copy", {}).items()
                      if job != "copy"))
    cols = ("workload", "shape", "extra MB", "floor", "target", "sustained", "bench", "W", "MHz", "dyn mJ",
            "cuBLAS dyn mJ", "beyond bytes mJ")
    lines = [head, ""]
    if md:
        lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = (r["workload"], "x".join(map(str, r["shape"])), f"{r['extra_MB']:.0f}",
                 f"**{r['floor_ratio']:.3f}**" if md and r["floor_over_target"] else f"{r['floor_ratio']:.3f}",
                 "-" if r["target"] is None else f"{r['target']:.2f}", f"{r['sustained_ratio']:.3f}",
                 "-" if r["bench_ratio"] is None else f"{r['bench_ratio']:.3f}", f"{r['power_w']:.0f}",
                 f"{r['sm_mhz']:.0f}", f"{r['dynamic_mj']:.1f}", f"{r['cublas_dynamic_mj']:.1f}",
                 f"{r['beyond_bytes_mj']:.1f}")
        lines.append("| " + " | ".join(cells) + " |" if md else "  ".join(f"{c:>14s}" for c in cells))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bench", help="a bench JSON (its rows' bytes and ratios)")
    ap.add_argument("power", help="a power_probe JSON of the same rows, with --baselines")
    ap.add_argument("--md", action="store_true", help="a markdown table")
    ap.add_argument("--out", help="also write the rows as JSON here")
    ap.add_argument("--static-w", type=float, help="take the static power as this many W instead of the measured "
                    "(the spinning block's): how much the floors depend on it")
    args = ap.parse_args(argv)
    model, rows = floors(json.loads(Path(args.bench).read_text()), json.loads(Path(args.power).read_text()),
                         args.static_w)
    print(render(model, rows, args.md))
    if args.out:
        Path(args.out).write_text(json.dumps({"model": model, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

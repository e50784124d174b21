"""Chart and markdown tables from an ``evtorch bench`` results file (``bench.json``).

    python -m benchmarks.plot benchmarks/results/bench_h200.json --png bench.png --md
    python -m benchmarks.plot bench.json --energy energy_floor.json --md    # with each row's energy floor

``chart(results, path)`` is what ``evtorch bench`` calls at the end of a run; ``markdown(results)`` gives the
tables of docs/benchmarks.md, so they can be regenerated from the JSON without a GPU.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def chart(results: dict, path) -> str | None:
    """Write the PNG: per shape, time / cuBLAS of evtorch, torch.compile and eager per workload (target line, and
    each row's energy floor where the run has one), and the identity epilogue's TFLOP/s against cuBLAS. Returns a
    message when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:  # noqa: BLE001
        return f"no chart: {type(exc).__name__}: {exc}"
    shapes = [tuple(s["shape"]) for s in results["shapes"]]
    fig, axes = plt.subplots(1, len(shapes) + 1, figsize=(6 * (len(shapes) + 1), 4.8), squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        rows = [r for r in results["rows"] if tuple(r["shape"]) == shape and r.get("evt_ms")]
        xs = range(len(rows))
        w = 0.27
        for i, (who, color) in enumerate((("evt", "tab:green"), ("compile", "tab:blue"), ("eager", "tab:gray"))):
            vals = [r.get(f"{who}_vs_cublas") or 0 for r in rows]
            ax.bar([x + (i - 1) * w for x in xs], vals, w, label="evtorch" if who == "evt" else who, color=color)
        # each row's energy floor (``evtorch bench --power``) as a bar-wide tick over its evtorch bar
        floors = [(x, r["energy_floor"]) for x, r in zip(xs, rows) if r.get("energy_floor")]
        if floors:
            ax.hlines([f for _, f in floors], [x - 1.5 * w for x, _ in floors], [x - 0.5 * w for x, _ in floors],
                      colors="k", lw=2.5, label="energy floor (700 W cap)")
        target = 1.05 if shape[2] >= 4096 else 1.15
        ax.axhline(1.0, color="k", lw=0.8)
        ax.axhline(target, color="r", ls="--", lw=0.8, label=f"target {target}")
        ax.set_xticks(list(xs))
        ax.set_xticklabels([r["workload"] for r in rows], rotation=35, ha="right", fontsize=8)
        ax.set_ylabel("time / cuBLAS GEMM alone")
        ax.set_title(f"{shape[0]}x{shape[1]}x{shape[2]} bf16")
        ax.set_ylim(0, max([2.5] + [min(4.0, (r.get("eager_vs_cublas") or 0) * 1.05) for r in rows]))
        ax.legend(fontsize=8)
    ax = axes[0][-1]
    ident = results.get("identity") or []
    if ident:
        xs = range(len(ident))
        ax.bar([x - 0.27 for x in xs], [r["cublas_tflops"] for r in ident], 0.27, label="cuBLAS", color="tab:gray")
        ax.bar(list(xs), [r["evt_tflops"] for r in ident], 0.27, label="evtorch (public call)", color="tab:green")
        ax.bar([x + 0.27 for x in xs], [2.0 * r["size"] ** 3 / r["evt_kernel_ms"] / 1e9 if r.get("evt_kernel_ms")
                                        else 0 for r in ident], 0.27, label="evtorch (kernel, graph replay)",
               color="tab:olive")
        ax.set_xticks(list(xs))
        ax.set_xticklabels([f"{r['size']}^3" for r in ident])
        ax.set_ylabel("TFLOP/s")
        ax.set_title("plain GEMM (identity epilogue)")
        ax.legend(fontsize=8)
    env = results["env"]
    fig.suptitle(f"evtorch bench: {env.get('device')} torch {env.get('torch')} triton {env.get('triton')} "
                 f"{env.get('date_utc')}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def _f(x, fmt="{:.3f}") -> str:
    return "-" if x is None else fmt.format(x)


def markdown(results: dict, limits: dict | None = None) -> str:
    """Markdown tables (one per shape, plus the identity sweep); ``limits`` maps (workload, K) -> a note."""
    limits = limits or {}
    # the energy floor column (``evtorch bench --power``: benchmarks.energy_floor) where the run has one
    energy = any("energy_floor" in r for r in results["rows"])
    out = []
    for s in results["shapes"]:
        M, N, K = s["shape"]
        out.append(f"#### {M} x {N} x {K}: compute floor {s['floor_compute_ms']:.4f} ms\n")
        out.append("| workload | cuBLAS ms | evtorch ms | kernel ms | evt / cuBLAS | "
                   + ("energy floor | " if energy else "") + "compile / cuBLAS | eager / cuBLAS "
                   "| evt / compile | TFLOP/s | GB/s | memory floor ms | max err evt / compile | config | limited by |")
        out.append("|---|---:|---:|---:|---:|" + ("---:|" if energy else "")
                   + "---:|---:|---:|---:|---:|---:|---|---|---|")
        for r in results["rows"]:
            if r["shape"] != s["shape"] or "evt_ms" not in r:
                continue
            cfg = (r.get("config") or "").replace("persistent_tma_", "tma ").replace("pingpong_", "pp ").replace(
                "_g8", "").replace("_prefetch", " pf").replace(
                "_epilogue_subtile", " sub").replace("_warp_specialize", " ws").replace("_flatten", " flat")
            out.append(
                f"| {r['workload']} | {_f(r.get('cublas_ms'), '{:.4f}')} | {r['evt_ms']:.4f} | "
                f"{_f(r.get('evt_kernel_ms'), '{:.4f}')} | **{r['evt_vs_cublas']:.3f}** | "
                + (f"{_f(r.get('energy_floor'))} | " if energy else "")
                + f"{_f(r.get('compile_vs_cublas'))} | {_f(r.get('eager_vs_cublas'))} | "
                f"{_f(r.get('evt_vs_compile'))} | "
                f"{r['evt_tflops']:.0f} | {r.get('evt_GBps', 0):.0f} | {r.get('floor_memory_ms', 0):.4f} | "
                f"{r.get('err_evt', 0):.1e} / {_f(r.get('err_compile'), '{:.1e}')} | {cfg} | "
                f"{limits.get((r['workload'], K), '')} |")
        out.append("")
    ident = results.get("identity") or []
    if ident:
        out.append("| size | cuBLAS TFLOP/s | evtorch TFLOP/s (public call) | % of cuBLAS | kernel % of cuBLAS |")
        out.append("|---|---:|---:|---:|---:|")
        for r in ident:
            out.append(f"| {r['size']}^3 | {r['cublas_tflops']:.0f} | {r['evt_tflops']:.0f} | "
                       f"{r['evt_pct_of_cublas']:.1f} | {_f(r.get('evt_kernel_pct_of_cublas'), '{:.1f}')} |")
    return "\n".join(out)


def with_energy_floors(results: dict, floors: dict) -> dict:
    """``results`` with each row's ``energy_floor`` taken from a ``benchmarks.energy_floor --out`` JSON (a probe of
    the same configs run apart from the bench), matched by workload and shape; rows it has no floor for keep none."""
    from benchmarks.energy_floor import attach_floors

    out = dict(results, rows=[dict(r) for r in results["rows"]])
    attach_floors(out["rows"], floors["rows"])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.plot")
    ap.add_argument("results", help="bench.json")
    ap.add_argument("--png", help="write the chart here")
    ap.add_argument("--md", action="store_true", help="print the markdown tables")
    ap.add_argument("--energy", metavar="FLOORS_JSON",
                    help="each row's energy floor from `python -m benchmarks.energy_floor ... --out FLOORS_JSON`")
    args = ap.parse_args(argv)
    results = json.loads(Path(args.results).read_text())
    if args.energy:
        results = with_energy_floors(results, json.loads(Path(args.energy).read_text()))
    if args.png:
        msg = chart(results, args.png)
        if msg:
            print(msg, file=sys.stderr)
    if args.md:
        print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The benchmark tools that run without a GPU: report summaries (Nsight Compute, power), the paired timer, the bench's
rows and torch.compile phase, the ablation, probe and tuner-timing helpers."""
import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import ncu_probe  # noqa: E402

REPORT = ROOT / "benchmarks" / "results" / "ncu_h200_small_shape.txt"


def test_summary_of_the_stored_report():
    rows = ncu_probe.summarize(REPORT.read_text())
    assert [r["kernel"] for r in rows][:2] == ["nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "gemm_pingpong"]
    assert len(rows) == 8
    assert rows[0]["duration us"] == "98.14 us" and rows[0]["L2 bytes"] == "604.99 Mbyte"
    assert rows[6]["spill requests"] == "890,944" and rows[1]["SM GHz"] == "1.55 Ghz"


def test_summarize_prints_a_table(capsys):
    assert ncu_probe.main(["--summarize", str(REPORT)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| kernel | duration us |") and len(lines) == 2 + 8


def test_bad_jobs_are_named(capsys):
    with pytest.raises(SystemExit):
        ncu_probe.main(["lincomb_relu:nope"])
    assert "job 'lincomb_relu:nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ncu_probe.main([])
    assert "give at least one job" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ncu_probe.main(["bce_loss:mma_h_tma@EVTORCH_INTERMEDIATES"])  # a setting needs NAME=VALUE
    assert "WORKLOAD:CONFIG[@NAME=VALUE]" in capsys.readouterr().err


def test_ncu_job_variants_run_under_their_setting(monkeypatch):
    """``workload:config@NAME=VALUE``: the job's calls (its first, which traces, and the profiled one) see the
    variable set, and the environment is as before around them."""
    assert ncu_probe.split_job("bce_loss:mma_h_tma") == (("bce_loss", ":", "mma_h_tma"), None)
    assert ncu_probe.split_job("bce_loss:g_h@EVTORCH_INTERMEDIATES=float32") == (
        ("bce_loss", ":", "g_h"), ("EVTORCH_INTERMEDIATES", "float32"))
    assert ncu_probe.split_job("bce_loss:g_h@X=") == (("bce_loss", ":", "g_h"), ("X", ""))
    monkeypatch.setenv("EVT_PROBE_X", "outside")
    seen = []
    call = ncu_probe.with_env(("EVT_PROBE_X", "inside"), lambda: seen.append(os.environ["EVT_PROBE_X"]))
    call()
    call()
    assert seen == ["inside", "inside"] and os.environ["EVT_PROBE_X"] == "outside"
    plain = lambda: None  # noqa: E731
    assert ncu_probe.with_env(None, plain) is plain
    assert "mma_h_tma" in ncu_probe.configs()


def _source_export(path, kernels):
    """A source-page CSV as ``ncu --page source --csv --print-source sass`` writes it, one block per kernel."""
    cols = ["Address", "Source", "Warp Stall Sampling (All Samples)", "L1 Wavefronts Shared",
            "L1 Wavefronts Shared Ideal", "stall_barrier", "stall_long_sb", "stall_wait", "stall_no_inst",
            "stall_long_sb (Not Issued)"]
    lines = []
    for name, rows in kernels:
        lines.append(f'"Kernel Name","{name}",')
        lines.append(",".join(f'"{c}"' for c in cols))
        for i, row in enumerate(rows):
            lines.append(",".join(f'"{v}"' for v in [hex(16 * i), *row]))
    path.write_text("\n".join(lines) + "\n")


def test_stall_summary_counts_reasons_opcodes_and_bank_conflicts(tmp_path, capsys):
    """Samples by reason and opcode, parked warps (a barrier on a NOP) apart, the 'Not Issued' columns not
    counted twice, shared-memory wavefronts against the ideal; gzipped or plain."""
    rows = [["      NOP", 40, 0, 0, 40, 0, 0, 0, 0],
            ["@!P0  BRA 0x10", 30, 0, 0, 0, 25, 5, 0, 25],
            ["      FFMA R1, R2, R3, R4", 20, 0, 0, 0, 0, 12, 8, 0],
            ["      STS.64 [R1], R2", 10, 200, 100, 0, 0, 10, 0, 0],
            ["      LDS.128 R4, [R1]", 0, 50, 50, 0, 0, 0, 0, 0]]
    path = tmp_path / "source.csv"
    _source_export(path, [("gemm_pingpong", rows), ("nvjet", rows[1:3])])
    first, second = ncu_probe.stall_summary(str(path))
    assert first["kernel"] == "gemm_pingpong" and first["instructions"] == 5 and first["parked"] == 40
    assert first["samples"] == 60 and first["reasons"] == {"wait": 27, "long_sb": 25, "no_inst": 8}
    assert first["ops"] == {"BRA": 30, "FFMA": 20, "STS": 10, "LDS": 0}
    assert first["shared_wavefronts"] == {"actual": 250, "ideal": 150}
    assert second["samples"] == 50 and second["parked"] == 0
    import gzip
    gz = tmp_path / "source.csv.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    assert ncu_probe.stall_summary(str(gz)) == [first, second]
    assert ncu_probe.main(["--stalls", str(gz)]) == 0
    out = capsys.readouterr().out
    assert "0 gemm_pingpong: 5 SASS instructions, 60 stall samples (+40 parked); shared wavefronts 250 / ideal 150" in out
    assert "by reason: wait 45.0%, long_sb 41.7%, no_inst 13.3%" in out
    # samples over SASS row ranges of one kernel (a partition or a phase of it), parked warps left out
    whole, tail = ncu_probe.range_summary(str(gz), ["0:0-5", "1:1-2"])
    assert whole == {"range": "0:0-5", "instructions": 5, "samples": 60, "reasons": first["reasons"]}
    assert tail == {"range": "1:1-2", "instructions": 1, "samples": 20, "reasons": {"wait": 12, "no_inst": 8}}
    assert ncu_probe.main(["--stalls", str(gz), "--ranges", "0:1-3"]) == 0
    assert "0:1-3: 2 SASS rows, 50 stall samples; long_sb 50%, wait 34%, no_inst 16%" in capsys.readouterr().out


def test_paired_timer_interleaves_rounds(tmp_path):
    """Harness.paired times the functions in turn, round after round (so a ratio's two times see the same clocks),
    each round with 1/rounds of the repeats and starting one function later than the last (so a disturbance at a
    fixed point of the sequence does not always fall on one function), and reports each function's median over
    the rounds, its times in round order."""
    import types

    from benchmarks.harness import Harness

    h = Harness(types.SimpleNamespace(out=str(tmp_path), deadline_s=60), "t", {}, cuda=False, warmup_ms=1,
                rep_ms=30, t0=0.0)
    calls, reps = [], []
    fake = iter([1.0, 5.0, 3.0, 2.0, 4.0, 9.0])
    h.timer = lambda fn, rep=None: (fn(), reps.append(rep), next(fake))[2]
    out = h.paired({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, rounds=3)
    assert calls == ["a", "b", "b", "a", "a", "b"] and reps == [10.0] * 6
    assert out == {"a": (2.0, [1.0, 2.0, 4.0]), "b": (5.0, [5.0, 3.0, 9.0])}
    fake = iter(range(10))
    calls.clear()
    out = h.paired({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")})  # default: five rounds
    assert calls == ["a", "b", "b", "a"] * 2 + ["a", "b"] and out["a"] == (4, [0, 3, 4, 7, 8])
    fake = iter(range(9))
    calls.clear()
    out = h.paired({k: (lambda k=k: calls.append(k)) for k in "xyz"}, rounds=3)
    assert calls == list("xyzyzxzxy") and out["x"][1] == [0, 5, 7] and out["z"][1] == [2, 4, 6]


def test_power_probe_parses_samples_and_reasons():
    """The power probe's nvidia-smi rows (power W, SM MHz, memory MHz, clock-event mask in hex, temperature C):
    malformed lines (a header, '[N/A]') are skipped, and the mask names its reasons."""
    from benchmarks.power_probe import _parse, _reasons

    rows = _parse(["690.12, 1635, 3201, 0x0000000000000004, 60", "[N/A], 1635, 3201, 0x4, 60",
                   "power.draw [W], clocks.sm [MHz]", "120.5, 1980, 3201, 0x0000000000000001, 41"])
    assert rows == [{"power_w": 690.12, "sm_mhz": 1635.0, "mem_mhz": 3201.0, "reasons": 4, "temp_c": 60.0},
                    {"power_w": 120.5, "sm_mhz": 1980.0, "mem_mhz": 3201.0, "reasons": 1, "temp_c": 41.0}]
    assert _reasons(0x4 | 0x8) == ["sw_power_cap", "hw_slowdown"]
    assert _reasons(0) == []


def test_power_probe_takes_jobs_from_a_bench_run():
    """--from-bench: per shape, the rows' workloads with the configs recorded there, cuBLAS first, after every
    fourth row and last; rows without a recorded config (skipped, or from before config_dict) are left out."""
    from benchmarks.power_probe import bench_jobs

    cfg = {"template": "pingpong", "BLOCK_M": 128}
    rows = [{"workload": f"w{i}", "shape": [64, 32, 16], "config_dict": cfg} for i in range(5)]
    rows += [{"workload": "old", "shape": [64, 32, 16], "config": "x"},
             {"workload": "w9", "shape": [8, 8, 8], "config_dict": cfg}]
    plan = bench_jobs({"rows": rows})
    assert [j for j, _ in plan["64x32x16"]] == ["cublas", "w0", "w1", "w2", "w3", "cublas", "w4", "cublas"]
    assert plan["8x8x8"] == [("cublas", None), ("w9", cfg), ("cublas", None)]


def test_bench_power_rows_follow_the_picked_configs(monkeypatch):
    """``evtorch bench --power``: the energy model's baselines first, then each bench row's workload with its
    recorded config, cuBLAS interleaved, into ``results["power"]``; each probed row gets its energy floor; a job
    that would pass the deadline is skipped and logged; a failing sampler (no nvidia-smi) stops the probe without
    losing the rows."""
    from benchmarks import power_probe, run
    from benchmarks.power_probe import COPY_BYTES

    calls = []
    baseline = {"idle": (None, 70.0), "spin": (0.5, 110.0), "copy": (0.4, 510.0)}

    def fake_measure(job, M, N, K, seconds, config=None):
        calls.append((job, (M, N, K), config))
        if job == "boom":
            raise FileNotFoundError("nvidia-smi")
        ms, w = baseline.get(job, (0.1 if job == "cublas" else 0.12, 690.0))
        r = {"job": job, "shape": None if job in baseline else [M, N, K], "ms_per_launch": ms, "power_w": w,
             "sm_mhz": 1600.0, "reasons": ["sw_power_cap"]}
        if job == "copy":
            r["bytes_per_launch"] = COPY_BYTES
        return r

    monkeypatch.setattr(power_probe, "measure", fake_measure)
    monkeypatch.setattr(power_probe, "board_limits", lambda: "700.00, 700.00, 1980")

    class FakeBench:
        def __init__(self, rows, left):
            self.results, self.left, self.logged = {"rows": rows}, left, []

        def time_left(self):
            return self.left

        def log(self, text):
            self.logged.append(text)

        def save(self):
            pass

    cfg = {"template": "pingpong"}
    row = {"workload": "bce_loss", "shape": [64, 32, 16], "config_dict": cfg,
           "bytes": 2 * (64 * 16 + 16 * 32 + 64 * 32)}
    b = FakeBench([dict(row)], left=100.0)
    run.power_rows(b, 2.0)
    base = [(job, (0, 0, 0), None) for job in ("idle", "spin", "copy")]
    assert calls == base + [("cublas", (64, 32, 16), None), ("bce_loss", (64, 32, 16), cfg),
                            ("cublas", (64, 32, 16), None)]
    assert [r["job"] for r in b.results["power"]] == ["idle", "spin", "copy", "cublas", "bce_loss", "cublas"]
    # no extra bytes: the floor is cuBLAS's dynamic energy over the cap's dynamic budget
    assert abs(b.results["rows"][0]["energy_floor"] - (690.0 - 110.0) / (700.0 - 110.0)) < 1e-12
    assert b.results["energy_model"]["static_w"] == 110.0 and "beyond_bytes_mj" in b.results["rows"][0]
    from benchmarks.plot import markdown

    b.results["shapes"] = [{"shape": [64, 32, 16], "floor_compute_ms": 0.001}]
    b.results["rows"][0].update(evt_ms=0.12, evt_vs_cublas=1.2, evt_tflops=1.0)
    assert "| energy floor |" in markdown(b.results) and "| 0.983 |" in markdown(b.results)
    b.results.update(env={}, ceilings={}, identity=[])
    b.results["shapes"][0].update(cublas_ms=[0.1], cublas_tflops=1.0)
    run.table(b)  # the printed summary: the floor right after evt / cuBLAS
    head, line = b.logged[-1].splitlines()[-2:]
    assert head.split()[9:11] == ["evt/cub", "e.floor"] and line.split()[5:7] == ["1.200", "0.983"]
    late = FakeBench([dict(row)], left=3.0)
    run.power_rows(late, 2.0)
    assert late.results["power"] == [] and any("deadline" in line for line in late.logged)
    assert "energy_floor" not in late.results["rows"][0]
    assert any("energy floor: not computed" in line for line in late.logged)
    calls.clear()
    broken = FakeBench([{"workload": "boom", "shape": [8, 8, 8], "config_dict": cfg}], left=100.0)
    run.power_rows(broken, 2.0)
    assert [r["job"] for r in broken.results["power"]] == ["idle", "spin", "copy", "cublas"]
    assert "FileNotFoundError" in broken.logged[-1] and "energy_model" not in broken.results

def _eager(fn, acc, inputs):
    out = fn(acc, **inputs)
    return out if isinstance(out, tuple) else (out,)


def test_ablation_members_trace_to_their_eager_functions():
    """Every member of ``benchmarks.ablation`` is an epilogue evtorch accepts, and its traced graph computes what the
    eager function does (fp32 accumulator, bf16 inputs, fresh random data): the ablation times what it names."""
    import torch

    from benchmarks.ablation import FAMILIES, MEMBERS
    from evtorch.api import get_epilogue

    assert len(MEMBERS) == sum(len(m) for m in FAMILIES.values())  # names are unique across families
    torch.manual_seed(0)
    M, N = 48, 40
    for name, (fn, make) in MEMBERS.items():
        inputs = make(M, N, "cpu", torch.bfloat16)
        acc = torch.randn(M, N)
        ep = get_epilogue(fn, (M, N), torch.float32, inputs)
        got = ep.reference(acc, out_dtype=torch.float32, **inputs)
        got = got if isinstance(got, tuple) else (got,)
        want = _eager(fn, acc, inputs)
        assert len(got) == len(want), name
        for g, w in zip(got, want):
            torch.testing.assert_close(g.float(), w.float(), rtol=2e-2, atol=2e-2, msg=lambda m: f"{name}: {m}")


def test_each_ablation_family_ends_with_its_bench_workload():
    """The last member of a family is the bench workload itself (same outputs on the same data), so a family's
    parts add up to a row of ``evtorch bench``."""
    import torch

    from benchmarks.ablation import FAMILIES
    from benchmarks.workloads import WORKLOADS

    torch.manual_seed(1)
    M, N = 32, 24
    for family, members in FAMILIES.items():
        name, fn, make = members[-1]
        assert name in WORKLOADS, family
        inputs = make(M, N, "cpu", torch.float32)
        acc = torch.randn(M, N)
        for g, w in zip(_eager(fn, acc, inputs), _eager(WORKLOADS[name].fn, acc, inputs)):
            torch.testing.assert_close(g, w)


def test_ablation_configs_follow_what_the_epilogue_allows(capsys):
    """``regs`` always; ``mma`` with TMA_STORE = the epilogue's tile outputs (none for an epilogue that stores no
    tile); ``tma`` only with one M x N input for the loader; ``smem`` when asked. And the power probe takes members
    as jobs."""
    import torch

    from benchmarks import ablation

    names = ["regs", "mma", "tma", "smem"]
    two = ablation.configs_for(ablation.g_full, {"bias": torch.randn(64)}, 128, 64, names)
    assert set(two) == {"regs", "mma", "smem"} and two["mma"].flag("TMA_STORE") == 2
    assert two["regs"].flag("EPI_MMA") is False and two["regs"].num_stages == 5
    one_input = ablation.configs_for(ablation.d_product, {"pre": torch.randn(128, 64, dtype=torch.bfloat16)},
                                     128, 64, names)
    assert one_input["tma"].flag("EPI_TMA") is True and one_input["tma"].flag("TMA_STORE") == 1
    no_tiles = ablation.configs_for(lambda acc: acc.sum(dim=1), {}, 128, 64, names)  # stores no tile
    assert no_tiles["mma"].flag("EPI_MMA") is True and no_tiles["mma"].flag("TMA_STORE") == 0
    assert "tma" not in no_tiles
    assert ablation.named_epilogue("bias_two_stores") == ablation.MEMBERS["bias_two_stores"]
    assert ablation.named_epilogue("identity")[0](3) == 3
    with pytest.raises(SystemExit):  # ncu_probe takes members too, and says so when the config is unknown
        ncu_probe.main(["bias_two_stores:nope"])
    err = capsys.readouterr().err
    assert "job 'bias_two_stores:nope'" in err and "'bias_two_stores'" in err


def test_ablation_variant_b_sets_and_restores_the_environment(monkeypatch):
    """``--ab``: inside ``variant_b`` the setting holds and evtorch's remembered launches are dropped (so variant B
    prepares its own kernels); on exit the old value (or its absence) is back and the caches are dropped again."""
    import os

    import evtorch.runtime.gemm as rg
    from benchmarks.ablation import variant_b

    cleared = []
    monkeypatch.setattr(rg, "clear_caches", lambda: cleared.append(os.environ.get("EVTORCH_ABLATION_KNOB")))
    monkeypatch.delenv("EVTORCH_ABLATION_KNOB", raising=False)
    with variant_b(("EVTORCH_ABLATION_KNOB", "3")):
        assert os.environ["EVTORCH_ABLATION_KNOB"] == "3"
    assert "EVTORCH_ABLATION_KNOB" not in os.environ and cleared == [None, None]
    monkeypatch.setenv("EVTORCH_ABLATION_KNOB", "old")
    with pytest.raises(RuntimeError):
        with variant_b(("EVTORCH_ABLATION_KNOB", "new")):
            raise RuntimeError("a failing call")
    assert os.environ["EVTORCH_ABLATION_KNOB"] == "old"


def test_paired_settles_like_the_tuner(monkeypatch, tmp_path):
    """On a GPU, Harness.paired first runs every function in turn through ``autotune.settle`` (calls queued back to
    back for settle_ms, by default the tuner's warm-up, ``autotune.WARMUP_MS``), then times one round it discards,
    then its rounds; settle_ms=0 skips the settling."""
    import itertools
    import types

    import evtorch.runtime.autotune as autotune
    from benchmarks.harness import Harness

    h = Harness(types.SimpleNamespace(out=str(tmp_path), deadline_s=60), "t", {}, cuda=True, warmup_ms=1,
                rep_ms=30, t0=0.0)
    calls, settled = [], []

    def fake_settle(fn, ms):
        settled.append(ms)
        fn()
        return 0.1

    monkeypatch.setattr(autotune, "settle", fake_settle)
    timed, fake = [], itertools.chain([9.0, 9.0, 1.0, 2.0, 3.0, 4.0], itertools.repeat(5.0))
    h.timer = lambda fn, rep=None: (timed.append(fn), next(fake))[1]
    fa, fb = (lambda: calls.append("a")), (lambda: calls.append("b"))
    out = h.paired({"a": fa, "b": fb}, rounds=2, settle_ms=250)
    assert settled == [250] and calls == ["a", "b"]
    # on CUDA one round is timed first and discarded (the first timing after the settling runs high)
    assert timed == [fa, fb, fa, fb, fb, fa] and out == {"a": (2.5, [1.0, 4.0]), "b": (2.5, [2.0, 3.0])}
    h.paired({"a": lambda: calls.append("a")}, rounds=1, settle_ms=0)
    assert settled == [250]
    monkeypatch.setattr(autotune, "WARMUP_MS", 1234.0)
    h.paired({"a": lambda: calls.append("a")}, rounds=1)
    assert settled == [250, 1234.0]


def test_compile_probe_configs_follow_the_epilogue():
    """compile_probe's forced configs: the persistent halves, the ablation's two ping-pong layouts for this
    epilogue (the wgmma one storing both of bias_gelu_aux's tiles by TMA) and the portable tiles; without an
    epilogue, no ping-pong ones."""
    import torch

    from benchmarks import compile_probe
    from benchmarks.workloads import WORKLOADS

    fn, make = WORKLOADS["bias_gelu_aux"][:2]
    cfgs = compile_probe._configs(fn, make(128, 128, "cpu", torch.bfloat16), 128, 128)
    assert list(cfgs)[:3] == ["pers", "pp", "pp_mma"] and cfgs["pp_mma"].flag("TMA_STORE") == 2
    assert cfgs["pers"].template == "persistent_tma" and cfgs["pp"].flag("EPI_MMA") is False
    assert {c.template for n, c in cfgs.items() if n.startswith("portable")} == {"portable"}
    assert "pp" not in compile_probe._configs()


def test_environ_and_poisoned_restore_the_environment(monkeypatch):
    """``experiment.environ`` sets a variable inside and puts back the old value, or its absence, even when the
    body raises; ``poisoned`` runs a call with EVTORCH_POISON=1 and returns its result."""
    import os

    from benchmarks.experiment import environ, poisoned

    monkeypatch.delenv("EVTORCH_POISON", raising=False)
    assert poisoned(lambda: os.environ.get("EVTORCH_POISON")) == "1"
    assert "EVTORCH_POISON" not in os.environ
    monkeypatch.setenv("EVTORCH_POISON", "0")
    with pytest.raises(ValueError):
        with environ("EVTORCH_POISON", "1"):
            raise ValueError("a failing call")
    assert os.environ["EVTORCH_POISON"] == "0"


def test_tuner_timing_judges_each_mode_by_the_bench_measurement():
    """A mode's pick is its lowest median over the rounds; its cost is what the bench's measurement gives that pick
    over the bench's best, and its ranking is compared with the bench's by rank correlation."""
    from benchmarks import tuner_timing

    samples = {
        "bench": {"a": [1.00, 1.02, 0.99], "b": [0.95, 0.96, 1.30], "c": [1.10, 1.12, 1.11]},
        "back_to_back": {"a": [0.90, 0.91, 0.92], "b": [0.99, 0.98, 0.97], "c": [1.2, 1.2, 1.2]},
    }
    s = tuner_timing.summarize(samples)
    assert s["bench"]["pick"] == "b" and s["bench"]["pick_cost"] == 1.0 and s["bench"]["spearman"] == 1.0
    assert s["back_to_back"]["pick"] == "a"
    assert s["back_to_back"]["pick_cost"] == pytest.approx(1.00 / 0.96)
    assert s["back_to_back"]["spearman"] == pytest.approx(0.5)  # a and b swapped, c last in both
    assert tuner_timing.spearman([1, 2, 3], [3, 2, 1]) == -1.0


def test_tuner_state_parses_rows_and_picks_each_templates_fastest():
    """tuner_state's row list (WORKLOAD@MxNxK, a malformed entry named in the error) and its choice of the tuner's
    fastest candidate per template (failed candidates, None, skipped; other templates ignored)."""
    import pytest

    from benchmarks import tuner_state

    assert tuner_state.parse_rows("bias_gelu_aux@8192x8192x4096, lincomb_relu@64x32x16,") == [
        ("bias_gelu_aux", (8192, 8192, 4096)), ("lincomb_relu", (64, 32, 16))]
    for bad in ("bias_gelu_aux", "x@1x2", "@1x2x3", "w@1x0x3", "w@axbxc"):
        with pytest.raises(ValueError, match="WORKLOAD@MxNxK"):
            tuner_state.parse_rows(bad)
    timings = {"persistent_tma_128x256x64_a": 0.90, "persistent_tma_128x256x64_b": 0.88, "pingpong_x": 0.89,
               "pingpong_y": None, "portable_z": 0.50}
    assert tuner_state.template_picks(timings) == {"persistent_tma": "persistent_tma_128x256x64_b",
                                                   "pingpong": "pingpong_x"}
    assert tuner_state.template_picks({"pingpong_y": None}) == {}


def test_tuner_state_summarises_the_samples_of_a_window():
    """The sampler's stamped nvidia-smi lines: medians of power, SM clock and temperature over the lines inside
    the window; unparseable lines and lines outside it are left out."""
    from benchmarks import tuner_state

    samples = [(0.5, "650.0, 1700, 2619, 0x4, 50"), (1.0, "690.0, 1600, 2619, 0x4, 60"),
               (1.5, "[N/A], 1500, 2619, 0x4, 61"), (2.0, "700.0, 1500, 2619, 0x0, 62"),
               (3.5, "100.0, 300, 2619, 0x1, 40")]
    assert tuner_state.window_stats(samples, 1.0, 2.0) == {"samples": 2, "power_w": 695.0, "sm_mhz": 1550.0,
                                                           "temp_c": 61.0}
    assert tuner_state.window_stats(samples, 5.0, 6.0) == {"samples": 0, "power_w": None, "sm_mhz": None,
                                                           "temp_c": None}


def test_rounds_profile_averages_each_round_over_its_rows_median(tmp_path, capsys):
    """benchmarks.rounds: per round, the mean of round time / row median and how often it was the row's slowest;
    rows without the series (or of another length) are left out; the command line reads bench JSONs."""
    import json

    from benchmarks import rounds

    rows = [{"evt_ms_rounds": [1.0, 1.0, 2.0]}, {"evt_ms_rounds": [2.0, 4.0, 2.0]}, {"evt_ms_rounds": [1.0]},
            {"cublas_ms_rounds": [1.0, 1.0, 1.0]}]
    p = rounds.profile(rows, "evt_ms_rounds")
    assert p["rows"] == 2 and p["mean"] == [1.0, 1.5, 1.5] and p["slowest"] == [0, 1, 1]
    assert rounds.profile(rows, "compile_ms_rounds") is None
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"rows": rows[:2]}))
    assert rounds.main([str(path), "--json", str(tmp_path / "p.json")]) == 0
    assert "evtorch, beside cuBLAS (and torch.compile, from 2026-11-27) (2 rows): mean per round 1.000 1.500 1.500; slowest in 0 1 1" in capsys.readouterr().out
    assert json.loads((tmp_path / "p.json").read_text())["evt_ms_rounds"]["rows"] == 2


def test_bench_shuts_the_compile_workers_down_before_each_torch_compile_row(monkeypatch):
    """Inductor's live compile-worker pool made a process's later heavy compiles twice as slow (docs/benchmarks-log.md,
    "torch.compile's compiles in one process"), so ``compile_rows`` shuts it down right before each row's first
    (compiling) call, and only then: the timed calls after it find the pool as the compile left it."""
    import types

    import torch

    from benchmarks import run

    events = []
    monkeypatch.setattr(run, "shutdown_compile_workers", lambda: events.append("shutdown"))

    def fake_compile(fn, **kwargs):
        def compiled(A, B, **inputs):
            events.append("call")
            return fn(A, B, **inputs)
        return compiled

    monkeypatch.setattr(torch, "compile", fake_compile)
    rows = [{"workload": "lincomb_relu"}, {"workload": "identity"}]

    def fake_rows(b, want, *, left_s, skip, last=None):
        A, B = torch.randn(4, 3), torch.randn(3, 5)
        for row in rows:
            yield row, (4, 5, 3), {}, A, B, (lambda acc: acc), (lambda M, N, dev, dtype: {})

    monkeypatch.setattr(run, "_rows_in_time", fake_rows)
    def fake_time_row(b, row, shape_rec, A, B, fn, inputs, compile):
        compile()
        row.update(evt_ms=1.0, evt_vs_cublas=1.0, compile_ms=1.0, compile_vs_cublas=1.0, evt_vs_compile=1.0)

    monkeypatch.setattr(run, "_time_row", fake_time_row)
    bench = types.SimpleNamespace(results={"settings": {}}, args=types.SimpleNamespace(compile_mode="default"),
                                  dev="cpu", sync=lambda: None, log=lambda *parts: None)
    run.compile_rows(bench)
    # per row: the pool shut down, the compiling call, then the timed call (_time_row's), with no shutdown between
    assert events == ["shutdown", "call", "call"] * 2
    assert all("compile_s" in row and "err_compile" in row and "compile_error" not in row for row in rows)


def test_shutdown_compile_workers_uses_inductors_and_tolerates_its_absence(monkeypatch):
    from torch._inductor import async_compile

    from benchmarks import run

    calls = []
    monkeypatch.setattr(async_compile, "shutdown_compile_workers", lambda: calls.append(1))
    run.shutdown_compile_workers()
    assert calls == [1]
    monkeypatch.delattr(async_compile, "shutdown_compile_workers")
    run.shutdown_compile_workers()  # an Inductor without it: nothing to do


def test_schedule_probe_varies_group_m_of_each_bench_pick():
    """``schedule_probe --mode groups``: every row of a bench JSON with its picked config at each GROUP_M (the
    large shape at its own list), nothing else of the config changed; ``--shapes`` keeps only those shapes."""
    import argparse

    from benchmarks import schedule_probe
    from evtorch.codegen.configs import GemmConfig

    picks = ROOT / "benchmarks" / "results" / "bench_h100_run20261127_0241.json"
    args = argparse.Namespace(picks=str(picks), groups=[2, 8], groups_large=[4, 8, 16], shapes=None)
    rows = schedule_probe._group_rows(args, cuda=True)
    assert len(rows) == 16 and {r[1] for r in rows} >= {"identity", "mixed_dag"}
    for shape, workload, configs in rows:
        assert list(configs) == (["g2", "g8"] if shape[2] == 1024 else ["g4", "g8", "g16"])
        base = configs["g8"]
        assert all(c.GROUP_M == int(name[1:]) and isinstance(c, GemmConfig) for name, c in configs.items())
        assert all(c.extra == base.extra and c.template == base.template for c in configs.values())
    args.shapes = ["8192x4096x1024"]
    assert {r[0] for r in schedule_probe._group_rows(args, cuda=True)} == {(8192, 4096, 1024)}


@pytest.mark.parametrize("mode", ["waves", "groups"])
def test_schedule_probe_dry_run_writes_its_rows(tmp_path, mode):
    import json

    from benchmarks import schedule_probe

    assert schedule_probe.main(["--dry-run", "--out", str(tmp_path), "--mode", mode]) == 0
    result = json.loads((tmp_path / f"schedule_{mode}.json").read_text())
    assert result["rows"] and all(row["ms"]["cublas"] > 0 for row in result["rows"])


def _power_json(cublas_ms=0.1, cublas_w=690.0, row_ms=0.12, row_w=695.0):
    """A power_probe JSON with the baselines (idle 70 W, spin 110 W, a 1 GiB copy of 0.4 ms at 510 W) and one
    shape's cuBLAS and fused rows."""
    from benchmarks.power_probe import COPY_BYTES

    def row(job, shape, ms, w, **kw):
        return {"job": job, "shape": shape, "ms_per_launch": ms, "power_w": w, "sm_mhz": 1500.0, **kw}

    shape = [1024, 512, 256]
    return {"power_limit_w,max_limit_w,max_sm_mhz": "700.00, 700.00, 1980",
            "rows": [row("idle", None, None, 70.0), row("spin", None, 0.5, 110.0),
                     row("copy", None, 0.4, 510.0, bytes_per_launch=COPY_BYTES),
                     row("cublas", shape, cublas_ms, cublas_w), row("fused", shape, row_ms, row_w),
                     row("cublas", shape, cublas_ms, cublas_w)]}


def test_energy_floor_charges_the_extra_bytes_at_the_copy_energy():
    """The floor on fused / cuBLAS: (cuBLAS's dynamic energy + extra bytes x the copy's dynamic energy per byte)
    over the cap's dynamic budget, per cuBLAS time; worked by hand from the probe's numbers."""
    from benchmarks.energy_floor import energy_model, floors, gemm_bytes, render
    from benchmarks.power_probe import COPY_BYTES

    power = _power_json()
    model = energy_model(power)
    e_byte = (510.0 - 110.0) * 0.4e-3 / COPY_BYTES  # J per byte
    assert model["cap_w"] == 700.0 and model["static_w"] == 110.0
    assert abs(model["e_byte_pj"] - e_byte * 1e12) < 1e-9
    extra = 3 * 1024 * 512 * 2  # an M x N input and a second M x N output beyond the GEMM's
    bench = {"rows": [{"workload": "fused", "shape": [1024, 512, 256], "bytes": gemm_bytes(1024, 512, 256) + extra,
                       "evt_vs_cublas": 1.3},
                      {"workload": "unprobed", "shape": [1024, 512, 256], "bytes": 1}]}
    _, rows = floors(bench, power)
    assert [r["workload"] for r in rows] == ["fused"]  # rows without a probe row are left out
    r = rows[0]
    t_cub = 0.1e-3
    want = ((690.0 - 110.0) * t_cub + extra * e_byte) / ((700.0 - 110.0) * t_cub)
    assert abs(r["floor_ratio"] - want) < 1e-12 and r["floor_ratio"] > 690 / 700
    assert r["target"] is None and r["floor_over_target"] is None  # not one of the shapes
    assert abs(r["sustained_ratio"] - 1.2) < 1e-12 and r["bench_ratio"] == 1.3
    dyn = (695.0 - 110.0) * 0.12e-3
    assert abs(r["beyond_bytes_mj"] - (dyn - (690.0 - 110.0) * t_cub - extra * e_byte) * 1e3) < 1e-9
    text = render(model, rows, md=True)
    assert "| fused | 1024x512x256 |" in text and "pJ per byte" in text


def test_energy_floor_static_power_override():
    """--static-w: the model takes the given static power for both the copy's energy per byte and the cap's
    dynamic budget; a lower static power raises a floor that has extra bytes."""
    from benchmarks.energy_floor import floors, gemm_bytes

    bench = {"rows": [{"workload": "fused", "shape": [1024, 512, 256],
                       "bytes": gemm_bytes(1024, 512, 256) + 3 * 1024 * 512 * 2}]}
    m0, (r0,) = floors(bench, _power_json())
    m1, (r1,) = floors(bench, _power_json(), static_w=70.0)
    assert m0["static_w"] == 110.0 and m1["static_w"] == 70.0 and m1["e_byte_pj"] > m0["e_byte_pj"]
    assert r1["floor_ratio"] > r0["floor_ratio"]
    from benchmarks.energy_floor import render

    assert "static (given) 70 W" in render(m1, [r1]) and "static (one spinning block" in render(m0, [r0])


def test_energy_floor_needs_the_baselines():
    """Without the --baselines rows the model says which run it needs instead of dividing by nothing."""
    from benchmarks.energy_floor import energy_model

    power = _power_json()
    power["rows"] = [r for r in power["rows"] if r["job"] != "spin"]
    with pytest.raises(ValueError, match="spin.*--baselines"):
        energy_model(power)


def test_power_probe_summary_of_baseline_jobs():
    """Probe rows carry their energy per launch (W x ms = mJ); the idle board has no launch time and no energy;
    the copy says how many bytes a launch moves."""
    from benchmarks.power_probe import COPY_BYTES, _summary

    samples = [{"power_w": w, "sm_mhz": 1500.0, "mem_mhz": 2619.0, "reasons": 4, "temp_c": 50.0}
               for w in (600.0, 620.0, 640.0)]
    r = _summary("copy", None, None, 0.5, samples)
    assert r["power_w"] == 620.0 and r["energy_mj"] == 310.0 and r["bytes_per_launch"] == COPY_BYTES
    assert r["power_reason_share"] == 1.0 and r["reasons"] == ["sw_power_cap"]
    idle = _summary("idle", None, None, None, samples[:1])
    assert idle["energy_mj"] is None and "bytes_per_launch" not in idle


def test_power_probe_copy_sizes():
    """``copy`` moves COPY_BYTES a launch, ``copy:MIB`` twice MIB MiB (read + written); a malformed size names
    the job and what it expects."""
    from benchmarks.power_probe import COPY_BYTES, copy_bytes

    assert copy_bytes("copy") == COPY_BYTES == 1 << 30
    assert copy_bytes("copy:1024") == 2 << 30
    for bad in ("copy:x", "copy:0", "copy:-4"):
        with pytest.raises(ValueError, match=r"copy:MIB"):
            copy_bytes(bad)


def test_plot_takes_energy_floors_from_a_separate_probe(tmp_path, capsys):
    """``benchmarks.plot --energy FLOORS``: the floors of a probe run apart from the bench join its rows by workload
    and shape (a row without one shows '-'), and the markdown gains the column; the results file is not changed."""
    import json

    from benchmarks import plot

    rows = [{"workload": w, "shape": [64, 32, 16], "evt_ms": 0.1, "evt_vs_cublas": 1.1, "evt_tflops": 1.0}
            for w in ("a", "b")]
    bench = {"shapes": [{"shape": [64, 32, 16], "floor_compute_ms": 0.001}], "rows": rows}
    floors = {"rows": [{"workload": "a", "shape": [64, 32, 16], "floor_ratio": 1.0423},
                       {"workload": "a", "shape": [8, 8, 8], "floor_ratio": 2.0}]}
    merged = plot.with_energy_floors(bench, floors)
    assert [r.get("energy_floor") for r in merged["rows"]] == [1.0423, None]
    assert "energy_floor" not in bench["rows"][0]
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    (tmp_path / "floors.json").write_text(json.dumps(floors))
    assert plot.main([str(tmp_path / "bench.json"), "--energy", str(tmp_path / "floors.json"), "--md"]) == 0
    out = capsys.readouterr().out
    assert "| energy floor |" in out and "| **1.100** | 1.042 |" in out and "| **1.100** | - |" in out


def test_ab_check_dry_run_interleaves_its_rounds(tmp_path, monkeypatch):
    """ab_check (an A/B of one environment setting): every variant timed in --rounds interleaved rounds per
    forced config, the medians' ratio recorded, both variants checked against the float64 reference."""
    import json

    from benchmarks import ab_check

    monkeypatch.setenv("EVTORCH_CACHE_DIR", str(tmp_path / "cache"))  # (main points it at a fresh directory)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert ab_check.main(["--dry-run", "--out", str(tmp_path), "--env", "EVTORCH_DISABLE_PASSES=reassociate",
                          "--workloads", "bias_gelu_aux", "--rounds", "2", "--no-tune"]) == 0
    row, = json.loads((tmp_path / "ab.json").read_text())["rows"]
    forced, = row["forced"].values()
    assert len(forced["A"]) == len(forced["B"]) == 2 and all(t > 0 for t in forced["A"] + forced["B"])
    assert forced["A_over_B"] > 0 and row["check"]["A"]["max_err_fp64"] < 2e-2
    with pytest.raises(SystemExit):
        ab_check.parse_args(["--out", "x", "--env", "A=1", "--rounds", "0"])
    assert ab_check.median_ratio([2.0, 4.0, 3.0], [1.0, None, 1.5]) == 3.0 / 1.25


def test_ab_check_takes_each_rows_config_from_a_bench_run(tmp_path, monkeypatch):
    """``--from-bench``: each row's config as the bench JSON recorded it is forced as 'bench' (alone, without
    --config); a row the run has no config for is skipped."""
    import json

    from benchmarks import ab_check

    cfg = {"template": "portable", "BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 8, "SPLIT_K": 1,
           "num_warps": 4, "num_stages": 2, "extra": {}}
    bench = {"rows": [{"workload": "bias_gelu_aux", "shape": [64, 64, 32], "config_dict": cfg},
                      {"workload": "lincomb_relu", "shape": [64, 64, 32], "config_dict": None}]}
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    monkeypatch.setenv("EVTORCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    out = tmp_path / "out"
    assert ab_check.main(["--dry-run", "--out", str(out), "--env", "EVTORCH_DISABLE_PASSES=reassociate",
                          "--workloads", "bias_gelu_aux,lincomb_relu", "--rounds", "1", "--no-tune",
                          "--from-bench", str(tmp_path / "bench.json")]) == 0
    row, = json.loads((out / "ab.json").read_text())["rows"]
    assert row["workload"] == "bias_gelu_aux" and list(row["forced"]) == ["bench"]
    assert row["bench_config"].startswith("portable_32x32x32")
    assert len(row["forced"]["bench"]["A"]) == 1 and row["check"]["B"]["max_err_fp64"] < 2e-2
    assert "lincomb_relu 64x64x32: no config" in (out / "ab_log.txt").read_text()
    assert ab_check.parse_args(["--out", "x", "--env", "A=1"]).configs == ["tma_128x256_halves"]


def test_bench_intermediates_flag_sets_the_knob(monkeypatch):
    """``evtorch bench --intermediates float32`` runs the epilogues with float32 intermediates (the knob, read at
    trace time, and recorded in the JSON's settings); without the flag the environment decides."""
    from benchmarks import run
    from evtorch.runtime import knobs

    assert run.INTERMEDIATE_MODES == knobs.INTERMEDIATE_MODES
    monkeypatch.setenv("EVTORCH_INTERMEDIATES", "eager")  # restored, whatever apply_intermediates writes
    run.apply_intermediates(run.build_parser().parse_args([]))
    assert knobs.intermediates_mode() == "eager"
    run.apply_intermediates(run.build_parser().parse_args(["--intermediates", "float32"]))
    assert knobs.intermediates_mode() == "float32"
    with pytest.raises(SystemExit):
        run.build_parser().parse_args(["--intermediates", "fp32"])


def test_bench_points_every_compile_cache_at_a_fresh_directory(monkeypatch):
    """The bench measures first calls (evtorch's tuning, torch.compile's max-autotune): each on-disk cache they read
    is a directory of the bench's process, unless the caller named one, which is kept and recorded."""
    from benchmarks import run

    for var in run.COMPILE_CACHES:  # setenv first: the undo then restores the variable, set or not
        monkeypatch.setenv(var, "x")
        monkeypatch.delenv(var)
    monkeypatch.setenv("TRITON_CACHE_DIR", "/somewhere/triton")
    caches = run.fresh_compile_caches()
    assert set(caches) == {"EVTORCH_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"}
    assert caches["TRITON_CACHE_DIR"] == "/somewhere/triton"
    fresh = [caches["EVTORCH_CACHE_DIR"], caches["TORCHINDUCTOR_CACHE_DIR"]]
    assert all(str(os.getpid()) in path for path in fresh) and len(set(fresh)) == 2
    assert all(os.environ[var] == path for var, path in caches.items())


def test_skinny_probe_configs_are_valid_hopper_configs():
    """skinny_probe's forced configs construct, fit an H100's shared memory in bf16 and leave each split-K slice at
    least four K blocks; the few-rows tiles the tuner offers are among them."""
    import torch

    from benchmarks.skinny_probe import configs
    from evtorch.codegen import configs as cfgmod
    from evtorch.codegen import policy

    hopper = cfgmod.DeviceInfo("cuda", "NVIDIA H100 80GB HBM3", (9, 0), 132, 232448)
    forced = configs(128, 4096, 4096)
    for name, cfg in forced.items():
        assert cfgmod.fits_smem(cfg, torch.bfloat16, hopper), name
        if cfg.template == "splitk":
            assert 4096 // (cfg.BLOCK_K * cfg.SPLIT_K) >= 4, name
    offered = {(c.BLOCK_M, c.BLOCK_N, c.BLOCK_K, c.num_stages) for c in policy._persistent_space(
        torch.bfloat16, policy._FEW_ROWS_16)}
    probed = {(c.BLOCK_M, c.BLOCK_N, c.BLOCK_K, c.num_stages) for c in forced.values()}
    assert offered <= probed


def test_host_overhead_runs_its_cases_in_a_process_of_their_own(tmp_path):
    """benchmarks/host_overhead.py (stubbed launches) measures each case, the compiled step included, and writes
    them as JSON. A subprocess: its stubs replace generated kernels process-wide."""
    import json
    import subprocess

    out = tmp_path / "host.json"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-m", "benchmarks.host_overhead", "--calls", "10", "--shape", "32", "32",
                          "16", "--only", "gemm_identity_fwd", "linear_fwd_bwd_compiled", "torch_linear_fwd_bwd",
                          "--autograd-one-thread", "--json", str(out)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(out.read_text())
    assert set(result["us_per_call"]) == {"gemm_identity_fwd", "linear_fwd_bwd_compiled", "torch_linear_fwd_bwd"}
    assert result["autograd_one_thread"] and not result["real"]
    assert all(v > 0 for v in result["us_per_call"].values())
    assert "linear_fwd_bwd_compiled" in run.stdout


def test_cost_model_fit_reads_the_runs_and_scores_the_policys_picks():
    """benchmarks.cost_model_fit: the timings of every config the heuristic ranks, a least-squares fit with a finite
    error, and the policy's own picks scored as the heuristic's tests score them: within 9% of the fastest at every
    shape and 0.4% on geometric mean with the memory floor at the H200's copy bandwidth, 0.9% without it
    (``--copy-gbps 0``)."""
    from benchmarks import cost_model_fit as cmf

    records = cmf.load(cmf.DEFAULT_RUNS)
    assert len(records) > 300 and {r["run"] for r in records} == set(cmf.DEFAULT_RUNS)
    bound = [r for r in records if cmf.memory_bound(r)]  # the fit leaves out the timings the memory floor sets
    assert 0 < len(bound) < len(records) / 4 and all(r["shape"][0] <= 512 for r in bound)
    model = cmf.fit(records, per_split=True)
    assert model["n"] == len(records) - len(bound)
    assert 0 < model["rms"] < 0.2 and model["step_cost"][("splitk", 128, 128)] == pytest.approx(1.0)
    behind = cmf.behind(records, cmf.current())
    timed = [v for v in behind.values() if v is not None]
    assert len(timed) == len(behind) and max(timed) < 1.09 and cmf.geomean(timed) < 1.005
    no_floor = [v for v in cmf.behind(records, cmf.current(), copy_gbps=0.0).values() if v is not None]
    assert 1.008 < cmf.geomean(no_floor) < 1.011
    assert cmf.main(["--runs", cmf.DEFAULT_RUNS[-1], "--copy-gbps", "0"]) == 0
    # the policy's constants are restored after scoring with others
    from evtorch.codegen import policy
    before = cmf.current()
    cmf.behind(records, dict(model, per_split=5.0))
    assert cmf.current() == before and policy.REDUCE_STEPS_PER_SPLIT == 0.0


def test_training_bench_says_what_a_first_call_tuned(tmp_path, monkeypatch):
    """``tuned_since``: the tuning records a first call wrote (label, candidates, phases), not those before it."""
    from benchmarks import training_bench as tb
    from evtorch.codegen.configs import GemmConfig
    from evtorch.runtime import autotune

    monkeypatch.setenv("EVTORCH_CACHE_DIR", str(tmp_path))
    cfg = GemmConfig("portable", 64, 64, 32)
    autotune.store("gpu=x|mnk=1", cfg, {cfg.short(): 0.5}, [cfg], label="old", phases={"compile": 1.0})
    before = tb.tuning_records()
    autotune.store("gpu=x|mnk=2", cfg, {cfg.short(): 0.4, "other": 0.6}, [cfg], label="fwd at 8x8x8",
                   phases={"compile": 2.0, "first_pass": 3.0})
    assert tb.tuned_since(before) == [{"label": "fwd at 8x8x8", "candidates": 2,
                                       "phases_s": {"compile": 2.0, "first_pass": 3.0}}]


def test_training_bench_dry_run_times_the_chosen_workloads(tmp_path):
    """benchmarks/training_bench.py through the interpreter: ``--workloads`` picks the rows (the MLP block with the
    fused and unfused hand-off as contenders), ``--profile`` is accepted (kernel lists need CUDA), an unknown
    workload is refused by name."""
    import json
    import subprocess

    env = dict(os.environ, TRITON_INTERPRET="1")
    cmd = [sys.executable, str(ROOT / "benchmarks" / "training_bench.py"), "--dry-run", "--skip-checks", "--no-compile",
           "--profile", "--workloads", "mlp", "--warmup-ms", "1", "--rep-ms", "1", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert [row["workload"] for row in result["rows"]] == ["mlp"]
    assert {"eager", "evt", "evt_fuse", "evt_nofuse"} <= set(result["rows"][0]["ms"]) and not result["errors"]
    # what each first call tuned (nothing on the interpreter, where the tuner never runs)
    assert result["rows"][0]["first_call_tuning"]["evt"] == []
    bad = subprocess.run(cmd[:-2] + ["--workloads", "mlp,conv"], env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--workloads: unknown conv" in bad.stderr


def test_host_ab_pairs_rounds_and_alternates_the_order(tmp_path, monkeypatch):
    """``benchmarks.host_ab``: rounds alternate which checkout runs first, and the summary pairs each round's A
    and B (the differences' median and range, the rounds where B was faster)."""
    from benchmarks import host_ab

    for tree in ("a", "b"):
        (tmp_path / tree / "evtorch").mkdir(parents=True)
        (tmp_path / tree / "benchmarks").mkdir()
        (tmp_path / tree / "benchmarks" / "host_overhead.py").write_text("")
    calls = []
    times = iter([10.0, 8.0, 9.0, 12.0, 11.0, 7.0])  # (a, b), then (b, a), then (a, b)

    def fake_run(tree, extra, out):
        calls.append((tree.name, tuple(extra)))
        return {"case": next(times)}
    monkeypatch.setattr(host_ab, "run_once", fake_run)
    assert host_ab.main(["--a", str(tmp_path / "a"), "--b", str(tmp_path / "b"), "--rounds", "3", "--only", "case",
                         "--json", str(tmp_path / "ab.json"), "--", "--device", "cpu"]) == 0
    assert [c[0] for c in calls] == ["a", "b", "b", "a", "a", "b"]
    assert calls[0][1] == ("--only", "case", "--device", "cpu")
    s = json.loads((tmp_path / "ab.json").read_text())["summary"]["case"]
    # rounds: a 10 b 8; b 9 a 12; a 11 b 7 -> differences -2, -3, -4
    assert s["diff_median"] == -3 and s["diff_range"] == [-4, -2] and s["b_faster_in"] == 3
    assert s["a_median"] == 11 and s["b_median"] == 8
    with pytest.raises(SystemExit):
        host_ab.main(["--a", str(tmp_path), "--b", str(tmp_path / "b")])  # not a checkout

"""The ``evtorch`` command: demo, show, tuning, bench/selftest dispatch, argument parsing; and evtorch.examples."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

import evtorch as evt
from evtorch import cli, demo
from evtorch.examples import EXAMPLES, eager_reference, operands
from evtorch.passes.pipeline import default_passes

SMALL = ["--size", "37,29,19", "--repeat", "1"]


def run(capsys, *argv):
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


# ------------------------------------------------------------------------------------------------ examples
@pytest.mark.parametrize("name", list(EXAMPLES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_example_matches_eager(name, dtype):
    fn, make_inputs = EXAMPLES[name]
    A, B = operands(45, 31, 17, "cpu", dtype)
    inputs = make_inputs(45, 31, "cpu", dtype)
    assert all(not isinstance(v, torch.Tensor) or v.abs().sum() > 0 for v in inputs.values()), "inputs are zeros"
    got, want = evt.gemm(A, B, fn, **inputs), eager_reference(fn, A, B, **inputs)
    got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        torch.testing.assert_close(g.double(), w.double(), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------------ demo
def test_demo_cpu_small_passes(capsys):
    rc, out, _ = run(capsys, "demo", "--device", "cpu", *SMALL)
    assert rc == 0, out
    for name in EXAMPLES:
        line = next(line for line in out.splitlines() if line.startswith(name))
        assert line.split()[-1] == "pass", line
    assert "max err" in out and "rel err" in out and "time ms" in out
    assert "37x29" in out   # output shapes


@pytest.mark.interpreter
def test_demo_generated_kernels_through_the_interpreter(capsys):
    """``--backend triton`` on CPU: the fused kernels the GPU would run, in Triton's interpreter."""
    rc, out, _ = run(capsys, "demo", "--device", "cpu", "--backend", "triton", "--size", "40,24,16", "--repeat", "0")
    assert rc == 0, out
    assert "backend triton" in out and out.count(" pass") == len(EXAMPLES)


def test_demo_through_the_interpreter_from_a_plain_environment():
    """Without TRITON_INTERPRET in the environment (the conftest sets it for the test above): importing evtorch
    imports triton, so the demo's own setting came too late and every example failed (found 2026-11-29); the
    command now runs itself again with it set. A bad --device is a usage error, not five torch errors."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "-m", "evtorch.cli", "demo", "--backend", "triton", "--example", "lincomb_relu", "--size",
           "40,24,16", "--repeat", "0"]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0 and "lincomb_relu" in res.stdout and " pass" in res.stdout, res.stdout + res.stderr
    res = subprocess.run([sys.executable, "-m", "evtorch.cli", "demo", "--device", "tpu"], capture_output=True,
                         text=True, env=env, timeout=600)
    assert res.returncode == 2 and "--device tpu: the demo runs on cpu or cuda" in res.stderr


def test_demo_repeat_and_suite_usage_lines(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["demo", "--repeat=-1"])
    assert e.value.code == 2 and "--repeat -1: expected 0 or more timed calls" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["bench", "training", "--help"])
    assert "usage: evtorch bench training" in capsys.readouterr().out


@pytest.mark.parametrize("dtype", ["bf16", "f32", "f64"])
def test_demo_dtypes(capsys, dtype):
    rc, out, _ = run(capsys, "demo", "--device", "cpu", "--dtype", dtype, "--example", "mixed_dag", *SMALL)
    assert rc == 0, out
    assert "mixed_dag" in out and "lincomb_relu" not in out


def test_demo_detects_a_wrong_result(capsys, monkeypatch):
    real = evt.gemm

    def off_by_a_bit(A, B, fn, **kw):
        out = real(A, B, fn, **kw)
        return tuple(o * 1.01 for o in out) if isinstance(out, tuple) else out * 1.01

    monkeypatch.setattr(demo.api, "gemm", off_by_a_bit)
    rc, out, _ = run(capsys, "demo", "--device", "cpu", *SMALL)
    assert rc == 1
    assert out.count("FAIL") == len(EXAMPLES)


def test_demo_reports_errors_and_goes_on(capsys, monkeypatch):
    real = evt.gemm

    def broken_for_bce(A, B, fn, **kw):
        if fn.__name__ == "bce_loss":
            raise RuntimeError("kernel exploded")
        return real(A, B, fn, **kw)

    monkeypatch.setattr(demo.api, "gemm", broken_for_bce)
    rc, out, _ = run(capsys, "demo", "--device", "cpu", *SMALL)
    assert rc == 1
    assert "bce_loss: RuntimeError: kernel exploded" in out
    assert "ERROR" in out and out.count(" pass") == len(EXAMPLES) - 1


def test_demo_compare_counts_nan_and_shape():
    assert demo.compare(torch.tensor([1.0, float("nan")]), torch.tensor([1.0, float("nan")])) == (0.0, 0.0)
    err, rel = demo.compare(torch.tensor([1.0, float("nan")]), torch.tensor([1.0, 2.0]))
    assert err != err or err > 0  # a NaN where eager has a number never passes
    with pytest.raises(AssertionError, match="shape"):
        demo.compare(torch.zeros(2), torch.zeros(3))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a GPU")
def test_demo_cuda_without_gpu_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["demo", "--device", "cuda"])
    assert e.value.code == 2
    assert "CUDA is not available" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["demo", "--size", "1,2"], ["demo", "--dtype", "int8"],
                                  ["demo", "--size", "0,4,4"],  # reported mixed_dag failing (eager's empty amax)
                                  ["show", "x.py:f", "--shape", "7"], ["nonsense"]])
def test_bad_command_lines_exit_2(capsys, argv):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2


def test_console_entry_point_runs():
    """``python -m evtorch.cli`` (what the installed ``evtorch`` script calls) in a fresh interpreter."""
    proc = subprocess.run([sys.executable, "-m", "evtorch.cli", "demo", "--device", "cpu", "--size", "16,8,4",
                           "--repeat", "0"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all 5 examples match eager PyTorch" in proc.stdout


# ------------------------------------------------------------------------------------------------ show
EPILOGUE = textwrap.dedent("""
    import torch

    def epi(acc, C, bias, alpha, beta=0.5):
        z = alpha * acc + beta * C + bias[:, None]
        D = torch.relu(z)
        return D, D.sum(dim=1)

    def broken(acc, C):
        return acc + C

    not_a_function = 3
""")


@pytest.fixture
def epi_file(tmp_path):
    path = tmp_path / "my_epi.py"
    path.write_text(EPILOGUE)
    return path


def test_show_prints_every_pass(capsys, epi_file):
    rc, out, _ = run(capsys, "show", f"{epi_file}:epi", "--shape", "64,48,32", "--input", "bias=M",
                     "--input", "alpha=scalar")
    assert rc == 0
    headers = [line for line in out.splitlines() if line.startswith("== ")]
    # the pipeline's passes, then code generation's plan (reassociation: never under the interpreter)
    assert [h.split()[1] for h in headers] == ["traced"] + [p.name for p in default_passes()] + ["reassociate"]
    assert "== reassociate == (code generation, fast math 'never', outputs in float16) (unchanged)" in out
    assert "%out1 : f32[M] vec" in out and "reduce sum" in out
    # C has no description and no default: full size in the A/B dtype; beta keeps its default (not an input)
    assert "C: float16[64, 48]" in out and "bias: float16[64]" in out and "alpha: scalar" in out
    assert "beta" not in out.splitlines()[0]
    assert "# outputs: 0 (tile), 1 (vector)" in out


def test_show_full_prints_each_ir(capsys, epi_file):
    rc, out, _ = run(capsys, "show", f"{epi_file}:epi", "--shape", "8,4", "--input", "bias=M",
                     "--input", "alpha=0.5", "--full")
    assert rc == 0 and "(unchanged)" not in out
    assert out.count("%acc : f32[MN] = acc") == len(default_passes()) + 2  # traced, each pass, code generation's


def test_show_batched_and_dtypes(capsys, epi_file):
    rc, out, _ = run(capsys, "show", f"{epi_file}:epi", "--shape", "16,8", "--batch", "3", "--dtype", "bf16",
                     "--input", "bias=M:f32", "--input", "alpha=scalar", "--input", "C=L,1,N", "--debug")
    assert rc == 0, out
    assert "acc: float32[3, 16, 8]" in out and "C: bfloat16[3, 1, 8]" in out and "bias: float32[16]" in out


def test_show_prints_the_reassociated_graph_a_gpu_would_emit(capsys, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")                   # what a GPU process would generate
    monkeypatch.setenv("EVTORCH_FAST_MATH", "auto")
    workloads = Path(__file__).resolve().parents[1] / "benchmarks" / "workloads.py"
    rc, out, _ = run(capsys, "show", f"{workloads}:bias_gelu_aux", "--shape", "32,16", "--dtype", "bf16",
                     "--input", "bias=N")
    assert rc == 0, out
    plan = out[out.index("== reassociate =="):]
    assert plan.startswith("== reassociate == (code generation, fast math 'auto', outputs in bfloat16)\n")
    assert "fma(" in plan and "# hardware approximations: %" in plan and "tanh" in plan


def test_show_backward_prints_what_is_saved_and_each_pass(capsys, monkeypatch):
    """--backward: the backward evt.gemm builds, as a GPU process would emit it (the bias gradient's fp32 sum keeps
    GELU's tanh accurate: its exact GPU form); --policy recompute saves no accumulator; a WRT list narrows it."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setenv("EVTORCH_FAST_MATH", "auto")
    workloads = Path(__file__).resolve().parents[1] / "benchmarks" / "workloads.py"
    base = ["show", f"{workloads}:bias_gelu_aux", "--shape", "32,16", "--dtype", "bf16", "--input", "bias=N"]
    rc, out, _ = run(capsys, *base, "--backward")
    assert rc == 0, out
    back = out[out.index("== backward:"):]
    assert back.startswith("== backward: gradients of outputs 0, 1 with respect to acc, bias (policy 'save') ==")
    assert "the accumulator A @ B, saved by the forward" in back and "# x0 = input bias" in back
    assert "== pass 1 of 1: bias_gelu_aux_bwd -> d_acc, x0 ==" in back
    assert "reduce sum" in back and "# exact GPU forms: %" in back and "tanh" in back
    assert re.search(r"# differentiated by their own rules: %\w+ = gelu\(%\w+\)", back), back
    monkeypatch.setenv("EVTORCH_DISABLE_PASSES", "composite_grads")
    rc, out, _ = run(capsys, *base, "--backward")
    assert rc == 0 and "differentiated by their own rules" not in out
    monkeypatch.delenv("EVTORCH_DISABLE_PASSES")
    rc, out, _ = run(capsys, *base, "--backward", "bias", "--policy", "recompute", "--source")
    assert rc == 0, out
    back = out[out.index("== backward:"):]
    assert "with respect to bias (policy 'recompute')" in back and "to recompute the accumulator" in back
    assert "tlmath.tanh_gpu(" in back                     # the pass's generated source
    rc, _, err = run(capsys, *base, "--backward", "acc,C")
    assert rc == 2 and "--backward acc,C" in err and "expected 'all' or" in err and "got C" in err


def test_show_module_target(capsys):
    rc, out, _ = run(capsys, "show", "evtorch.examples:bce_loss", "--shape", "32,16", "--input", "b=M")
    assert rc == 0 and "reduce sum" in out and "over=(M,N)" in out


def test_show_writes_dot(capsys, epi_file, tmp_path):
    dot = tmp_path / "g.dot"
    rc, out, _ = run(capsys, "show", f"{epi_file}:epi", "--shape", "8,4", "--input", "bias=M",
                     "--input", "alpha=scalar", "--dot", str(dot))
    assert rc == 0 and str(dot) in out
    text = dot.read_text()
    assert text.startswith('digraph "epi"') and "reduce" not in text.split("\n")[0] and "->" in text


def test_show_svg_renders_or_falls_back_to_dot(capsys, epi_file, tmp_path):
    svg = tmp_path / "g.svg"
    rc, out, _ = run(capsys, "show", f"{epi_file}:epi", "--shape", "8,4", "--input", "bias=M",
                     "--input", "alpha=scalar", "--dot", str(svg))
    assert rc == 0
    if svg.exists():
        assert "<svg" in svg.read_text()
    else:
        assert (tmp_path / "g.dot").read_text().startswith("digraph")
        assert f"dot -Tsvg {tmp_path / 'g.dot'} -o {svg}" in out


def test_show_source_prints_triton_or_says_unavailable(capsys, epi_file):
    rc, out, err = run(capsys, "show", f"{epi_file}:epi", "--shape", "8,4", "--input", "bias=M",
                       "--input", "alpha=scalar", "--source")
    if rc == 0:
        assert "@triton.jit" in out
    else:
        assert rc == 1 and "code generation is not available" in err


def test_show_epilogue_error_names_the_input(capsys, epi_file):
    rc, out, err = run(capsys, "show", f"{epi_file}:broken", "--shape", "8,4", "--input", "C=4,8")
    assert rc == 1
    assert "ShapeError" in err and "C" in err and "my_epi.py" in err


@pytest.mark.parametrize("extra, message", [
    (["--batch", "-2"], "expected a batch count L >= 1, got '-2'"),  # was a RuntimeError traceback from tracing
    (["--batch", "0"], "expected a batch count L >= 1, got '0'"),
    (["--dot", "{tmp}/no/such/dir/g.dot"], "--dot {tmp}/no/such/dir/g.dot: cannot write it"),  # FileNotFoundError
    (["--dot", "{tmp}/no/such/dir/g.svg"], "--dot {tmp}/no/such/dir/g.svg: cannot write it"),
])
def test_show_bad_batch_and_dot_name_the_option(capsys, epi_file, tmp_path, extra, message):
    with pytest.raises(SystemExit) as e:
        cli.main(["show", f"{epi_file}:epi", "--shape", "8,4", "--input", "bias=M", "--input", "alpha=scalar",
                  *[a.format(tmp=tmp_path) for a in extra]])
    assert e.value.code == 2
    assert message.format(tmp=tmp_path) in capsys.readouterr().err


@pytest.mark.parametrize("extra, message", [
    (["--input", "gamma=M"], "has no such keyword input"),
    (["--input", "bias=Q"], "cannot read 'Q'"),
    (["--input", "bias"], "NAME=SPEC"),
    (["--input", "bias=M:int3"], "cannot read"),
])
def test_show_bad_inputs(capsys, epi_file, extra, message):
    with pytest.raises(SystemExit) as e:
        cli.main(["show", f"{epi_file}:epi", "--shape", "8,4", *extra])
    assert e.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("target, message", [
    ("{file}:nope", "has no 'nope'; its functions: broken, epi"),
    ("{file}:not_a_function", "not a function"),
    ("{dir}/missing.py:epi", "no such file"),
    ("no_colon", "FILE.py:FUNC"),
    ("no_such_module_xyz:epi", "neither a file nor an importable module"),
])
def test_show_bad_targets(capsys, epi_file, target, message):
    with pytest.raises(SystemExit) as e:
        cli.main(["show", target.format(file=epi_file, dir=epi_file.parent), "--shape", "8,4"])
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_parse_input_forms():
    sizes = {"M": 6, "N": 5, "L": 2}
    name, v = cli.parse_input("C=M,N", sizes, torch.float16)
    assert name == "C" and v.shape == (6, 5) and v.dtype == torch.float16
    assert cli.parse_input("b=L,1,N:f32", sizes, torch.float16)[1].shape == (2, 1, 5)
    assert cli.parse_input("b=L,1,N:f32", sizes, torch.float16)[1].dtype == torch.float32
    assert cli.parse_input("v=64", sizes, torch.float16)[1].shape == (64,)
    assert cli.parse_input("s=()", sizes, torch.float16)[1].shape == ()
    assert cli.parse_input("alpha=scalar", sizes, torch.float16) == ("alpha", 1.0)
    assert cli.parse_input("alpha=-2.5e-3", sizes, torch.float16) == ("alpha", -2.5e-3)


# ------------------------------------------------------------------------------------------------ bench, selftest
@pytest.mark.parametrize("command, module", [("bench", "benchmarks.run"), ("selftest", "evtorch.selftest")])
def test_delegates_pass_arguments(monkeypatch, command, module):
    seen = []
    fake = types.ModuleType(module)
    fake.main = lambda argv: seen.append(argv) or 7
    monkeypatch.setitem(sys.modules, module, fake)
    assert cli.main([command, "--quick", "x"]) == 7
    assert seen == [["--quick", "x"]]


def test_selftest_only_selects_checks_by_name(monkeypatch):
    """``selftest --only TEXT``: only the checks whose name contains TEXT run (and are split into shards); the
    others are neither run nor counted. The case checks are stubbed (no GPU), and every selection below leaves out
    the template checks, which need one."""
    from evtorch import selftest, testing

    ran = []

    def fake_check(case, M, N, K, L, device, dtype, deterministic=False):
        ran.append(case.name)
        return [0.0]

    monkeypatch.setattr(testing, "check", fake_check)

    def run(only, shard=(0, 1)):
        ran.clear()
        return selftest.run(sizes=((8, 8, 8, 1),), dtypes=("float16",), deterministic=(False,), only=only,
                            shard=shard)

    cases = run("|float16|8x8x8|")
    names = list(ran)
    assert cases["passed"] == len(names) > 10 and cases["failed"] == 0
    pick = names[len(names) // 2]
    one = run(f"{pick}|float16|8x8x8|")
    assert ran == [pick] and one["passed"] == 1
    halves = [run("|float16|8x8x8|", shard=(i, 2))["passed"] for i in range(2)]
    assert sum(halves) == len(names) and min(halves) == len(names) // 2
    assert run("no such check")["passed"] == 0 and ran == []


def test_delegate_without_arguments_gets_sys_argv(monkeypatch):
    fake = types.ModuleType("evtorch.selftest")
    fake.main = lambda: 0 if sys.argv[1:] == ["-v"] else 5
    monkeypatch.setitem(sys.modules, "evtorch.selftest", fake)
    assert cli.main(["selftest", "-v"]) == 0


def test_missing_delegate_says_so(capsys, monkeypatch):
    monkeypatch.setitem(cli.DELEGATES, "bench", ("evtorch_no_such_module.run", "the benchmarks"))
    assert cli.main(["bench"]) == 2
    assert "evtorch_no_such_module.run" in capsys.readouterr().err


def _store_record(M, N, K, timings, best, final=None, phases=None):
    """One tuning record as the tuner stores it (``autotune.store``), for configs named in ``timings``; ``final``:
    the finalists' round times when the tuner's final picked ``best``; ``phases``: the tuning's phases (s)."""
    from evtorch.codegen.configs import GemmConfig
    from evtorch.runtime import autotune

    configs = {c.short(): c for c in (GemmConfig("portable", 128, 128, 32, 8, 1, 4, 3), GemmConfig("splitk", SPLIT_K=2),
                                      GemmConfig("persistent_tma", 128, 256, 64, 8, 1, 8, 3))}
    by_name = {name: configs[name] for name in timings}
    key = autotune.tune_key(device_name="NVIDIA H100 80GB HBM3", M=M, N=N, K=K, L=1, dtypes=[torch.bfloat16],
                            layout="A:row,B:row,bat:-", epilogue_hash="e" * 20, templates=["portable"])
    autotune.store(key, by_name[best], timings, list(by_name.values()), label=f"lincomb_relu at {M}x{N}x{K}",
                   samples={name: [ms, ms] for name, ms in timings.items()}, final=final, phases=phases)
    return key


def test_tuning_lists_clears_and_filters_the_stored_records(capsys, tmp_path, monkeypatch):
    """``evtorch tuning`` prints each stored key's fields, its pick and the candidates fastest first with their
    ratio to the fastest (failed ones named as such); match strings filter; --json round-trips the configs;
    --clear removes only the matching records."""
    from evtorch.codegen.configs import GemmConfig
    from evtorch.runtime import autotune

    monkeypatch.setenv("EVTORCH_CACHE_DIR", str(tmp_path))
    assert cli.main(["tuning"]) == 0 and "no records" in capsys.readouterr().out
    pers, port = "persistent_tma_128x256x64_g8_w8_s3", "portable_128x128x32_g8_w4_s3"
    sk = "splitk_64x64x32_g8_sk2_w4_s3"
    small = _store_record(8000, 4096, 1024, {port: 0.2, pers: 0.125, sk: float("inf")}, pers)
    phases = {"compile": 3.2, "loaded": 3.15, "warm_up": 0.3, "first_pass": 2.5, "final": 1.25}
    _store_record(8192, 8192, 4096, {port: 0.79, pers: 0.8}, pers, final={pers: [0.82, 0.81, 0.83],
                                                                         port: [0.84, 0.85, 0.83]}, phases=phases)
    assert cli.main(["tuning", "mnk=8192x4096x1024"]) == 0
    out = capsys.readouterr().out
    assert "NVIDIA H100 80GB HBM3" in out and "bucket 8192x4096x1024" in out and "8192x8192x4096" not in out
    lines = out.splitlines()
    assert lines[1:3] == ["  tuned for lincomb_relu at 8000x4096x1024", f"  picked {pers}"]
    assert lines[3].split() == ["0.1250", "ms", "x1.000", pers] and lines[4].split() == ["0.2000", "ms", "x1.600", port]
    assert lines[5].split() == ["failed", sk]
    assert cli.main(["tuning", "mnk=8192x8192x4096"]) == 0  # picked by the final, which the listing says
    lines = capsys.readouterr().out.splitlines()
    assert lines[2:5] == [f"  picked {pers}",  # the phases: the loaded time is part of the compile's, not added
                          "  took 7.25 s: compile 3.20 (GPU loaded 3.15), warm-up 0.30, first pass 2.50, final 1.25",
                          f"  by the final's interleaved rounds (median): 0.8200 ms {pers}, 0.8400 ms {port}"]
    assert lines[5].split() == ["0.7900", "ms", "x1.000", port]
    assert cli.main(["tuning", "--top", "1", "mnk=8192x4096x1024"]) == 0
    assert "1 more (--top 0 lists all)" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        cli.main(["tuning", "--top", "-1"])
    assert exc.value.code == 2 and "--top: expected a count of candidates >= 0" in capsys.readouterr().err
    assert cli.main(["tuning", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data) == 2 and {d["fields"]["mnk"] for d in data} == {"8192x4096x1024", "8192x8192x4096"}
    (rec,) = [d for d in data if d["key"] == small]
    assert rec["label"] == "lincomb_relu at 8000x4096x1024"
    assert GemmConfig.from_dict(rec["candidates"][pers]) == GemmConfig.from_dict(rec["best"])
    assert rec["timings_ms"][sk] is None
    assert rec["samples_ms"][pers] == [0.125, 0.125] and rec["samples_ms"][sk] == [None, None]
    assert rec["order"] == [port, pers, sk]  # the timing order (the candidates' map is sorted by name)
    assert rec["final_ms"] == {} and rec["phases_s"] == {}
    (big,) = [d for d in data if d["key"] != small]
    assert big["final_ms"] == {pers: [0.82, 0.81, 0.83], port: [0.84, 0.85, 0.83]} and big["phases_s"] == phases
    assert cli.main(["tuning", "--clear", "mnk=8192x4096x1024"]) == 0
    assert "removed 1 record" in capsys.readouterr().out
    assert [autotune.key_fields(r["key"])["mnk"] for r in autotune.stored_records()] == ["8192x8192x4096"]
    autotune.clear_memory_cache()


# ------------------------------------------------------------------------------------------------- configs
def test_configs_prints_the_heuristic_and_the_candidates(capsys):
    """``evtorch configs`` prints what the policy picks, with each config's layout on the named device: here
    split-K over TMA loads on 128x256 tiles for a weight gradient, its reduce kernel on 32x64 tiles."""
    from evtorch.codegen.configs import NAMED_DEVICES
    from evtorch.codegen.policy import candidate_configs, heuristic_config

    H200 = NAMED_DEVICES["h200"]
    rc, out, _ = run(capsys, "configs", "--shape", "768,768,49152", "--device", "h200", "--max", "4")
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].startswith("evtorch configs: 768x768x49152 bfloat16 on NVIDIA H200 (132 SMs, 227 KiB shared "
                               "memory a block, copies at 4226 GB/s)") and "TMA-able" in lines[0]
    h = heuristic_config(768, 768, 49152, torch.bfloat16, H200, tma_ok=True)
    assert lines[2].strip().startswith(f"{h.short()}: 18 tiles x 7 splits = 126 programs of 110 K blocks; "
                                       "reduce on 32x64: 288 programs, 4 warps")
    listed = candidate_configs(768, 768, 49152, torch.bfloat16, H200, tma_ok=True, max_candidates=4)
    numbered = [line.strip() for line in lines if line.strip()[:3] in ("1. ", "2. ", "3. ", "4. ")]
    assert [line.split(":")[0][3:] for line in numbered] == [c.short() for c in listed]
    assert "192 KiB of 227" in lines[2]
    # the rule that picked it, in words
    assert lines[1] == ("heuristic (EVTORCH_AUTOTUNE=0, and the tuner's fallback): 16+ 128x128 tiles below a wave "
                        "and a long K: split-K over TMA loads, 128x256 tiles on 7 splits of 7021; the cost model's "
                        "266 steps against 530 for the unsplit 64x128")


@pytest.mark.parametrize("shape, device, rule", [
    ("8192,8192,4096", "h200", "a wave or more of 128x128 tiles: the ping-pong kernel on halves"),
    ("128,4096,4096", "h200", "fewer than a wave of 128x128 tiles: the largest TMA tile that fills the SMs"),
    ("64,1024,8192", "h200", "split-K over 16-row tiles, 4 splits"),
    ("512,512,4096", "h200", "the smallest fills a fifth of the SMs or more: the smallest TMA tile"),
    ("768,768,8192", "h200", "split-K over TMA loads, 128x128 tiles on 3 splits of 2730; the cost model's 79 steps "
                             "against 88 for the unsplit 64x128"),
    ("48,48,64", "h200", "(under 64 rows or columns, or a K too short for the TMA tiles)"),
    ("37,45,29", "h200", "(no TMA template for these operands or this device)"),  # 58-byte rows: not TMA-able
    ("4096,4096,4096", "a100", "(no TMA template for these operands or this device)"),
])
def test_configs_says_which_rule_picked_the_heuristic(capsys, shape, device, rule):
    rc, out, _ = run(capsys, "configs", "--shape", shape, "--device", device, "--max", "1")
    assert rc == 0 and rule in out.splitlines()[1]


def test_configs_layouts_of_the_other_templates(capsys):
    rc, out, _ = run(capsys, "configs", "--shape", "8192,4096,1024", "--device", "hopper", "--max", "2")
    assert rc == 0 and "1024 tiles, 132 programs of 16 K blocks; 1.00 programs an SM (1 fit)" in out
    rc, out, _ = run(capsys, "configs", "--shape", "1000,1000,100", "--device", "a100", "--no-tma", "--dtype", "f32",
                     "--max", "1")
    assert rc == 0 and "A100 (108 SMs" in out and "not TMA-able" in out and "portable_" in out
    rc, out, _ = run(capsys, "configs", "--shape", "64,48,32", "--batch", "3", "--device", "hopper", "--max", "1")
    assert rc == 0 and "64x48x32 L=3" in out


@pytest.mark.parametrize("argv, message", [
    (["--shape", "64,64,0"], "expected sizes >= 1, got M,N,K = 64,64,0"),
    (["--shape", "64,64,64", "--device", "v100"], "--device: expected current or one of"),
    (["--shape", "64,64,64", "--max", "0"], "--max: expected a count of candidates >= 1, got 0"),
    (["--shape", "64,64,64", "--batch", "0"], "--batch: expected a batch count L >= 1, got '0'"),  # was unbatched
])
def test_configs_bad_arguments_name_the_option(capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        cli.main(["configs", *argv])
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_configs_for_an_epilogue_lists_what_the_tuner_times(capsys):
    """``--epilogue``: the candidates after ``policy.for_epilogue``, as ``runtime.gemm`` adjusts them for that
    epilogue: lincomb_relu's M x N input can come through the ping-pong loader (EPI_TMA), bias_gelu_aux has none
    (its EPI_TMA configs run in the wgmma layout with TMA stores instead)."""
    from evtorch import trace
    from evtorch.codegen.configs import HOPPER
    from evtorch.codegen.policy import candidate_configs
    from evtorch.codegen.program import build_program
    from evtorch.examples import lincomb_relu
    from evtorch.runtime.gemm import candidates_for_program

    def listed(out):
        return [line.strip().split(":")[0].split(". ", 1)[1] for line in out.splitlines()
                if line.startswith("  ") and ". " in line.strip()[:4]]

    rc, out, _ = run(capsys, "configs", "--shape", "8192,4096,1024", "--device", "hopper", "--epilogue",
                     "evtorch.examples:lincomb_relu", "--input", "alpha=scalar", "--input", "beta=scalar")
    assert rc == 0 and "# lincomb_relu(acc: float32[8192, 4096], C: bfloat16[8192, 4096]" in out
    ep = trace(lincomb_relu, acc=torch.empty(8192, 4096), C=torch.empty(8192, 4096, dtype=torch.bfloat16),
               alpha=1.0, beta=1.0)
    want = candidates_for_program(build_program(ep, torch.bfloat16),
                                  candidate_configs(8192, 4096, 1024, torch.bfloat16, HOPPER, tma_ok=True),
                                  torch.bfloat16, HOPPER)
    assert listed(out) == [c.short() for c in want] and any("epi_tma" in name for name in listed(out))
    workloads = Path(__file__).resolve().parents[1] / "benchmarks" / "workloads.py"
    rc, out, _ = run(capsys, "configs", "--shape", "8192,4096,1024", "--device", "hopper", "--epilogue",
                     f"{workloads}:bias_gelu_aux", "--input", "bias=N")
    assert rc == 0 and listed(out) and not any("epi_tma" in name for name in listed(out))
    assert any("tma_store" in name for name in listed(out))
    with pytest.raises(SystemExit) as e:
        cli.main(["configs", "--shape", "64,64,64", "--input", "bias=N"])
    assert e.value.code == 2 and "--input describes the inputs of --epilogue" in capsys.readouterr().err


def test_a_closed_pipe_ends_the_command_quietly(monkeypatch):
    """`evtorch configs ... | head -1`: the reader goes away, the command stops with status 1 and no traceback
    (a BrokenPipeError traceback before, found 2026-11-29)."""
    import io
    import os
    from evtorch.cli import main
    r, w = os.pipe()
    os.close(r)  # the reader is gone before anything is written
    out = io.TextIOWrapper(os.fdopen(w, "wb", buffering=0), write_through=True)
    monkeypatch.setattr("sys.stdout", out)
    assert main(["configs", "--shape", "768,768,49152", "--device", "h200", "--max", "4"]) == 1


def test_show_takes_builtins_and_partials(capsys, tmp_path):
    """``show torch:tanh`` raised inspect's ValueError (no signature) and a functools.partial an AttributeError
    (no __name__): evt.gemm and evt.trace take both (found 2026-11-29)."""
    rc, out, _ = run(capsys, "show", "torch:tanh", "--shape", "4,8")
    assert rc == 0 and "# tanh(acc: float32[4, 8])" in out and "tanh" in out
    f = tmp_path / "epis.py"
    f.write_text("import functools\nimport torch\n\ndef scaled(acc, s=2.0):\n    return torch.relu(acc * s)\n\n"
                 "half = functools.partial(scaled, s=0.5)\n")
    rc, out, _ = run(capsys, "show", f"{f}:half", "--shape", "4,8")
    assert rc == 0 and "# partial(acc: float32[4, 8]" in out

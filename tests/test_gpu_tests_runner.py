"""The sharded GPU-test runner (benchmarks/gpu_tests.py), run on CPU against a small suite of its own: sharding,
the report plugin, merging, and a shard stopped at its time limit."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import gpu_tests  # noqa: E402

SUITE = '''
import time
import pytest

pytestmark = pytest.mark.gpu

@pytest.mark.parametrize("i", range(5))
def test_pass(i):
    assert i >= 0

def test_fail():
    assert 1 == 2

def test_skip():
    pytest.skip("no reason")

@pytest.fixture
def broken():
    yield
    raise RuntimeError("teardown")

def test_teardown_fails(broken):
    pass

def test_slow():
    time.sleep({sleep})

def test_after_the_slow_one():
    pass
'''


def _suite(tmp_path, sleep):
    (tmp_path / "suite").mkdir()
    (tmp_path / "suite" / "test_suite.py").write_text(SUITE.format(sleep=sleep))
    other = tmp_path / "suite" / "test_cpu.py"
    other.write_text("def test_cpu_only():\n    pass\n")
    return tmp_path / "suite"


def test_shards_are_contiguous_runs_of_equal_count():
    ids = [f"a.py::t{i}" for i in range(10)]
    shards = gpu_tests.shard(ids, 3)
    assert [len(s) for s in shards] == [3, 4, 3] and sum(shards, []) == ids
    assert gpu_tests.shard(ids, 1) == [ids]
    assert gpu_tests.shard(ids, 12) == [[t] for t in ids]  # never an empty shard
    with pytest.raises(ValueError, match="shards: expected a positive count, got 0"):
        gpu_tests.shard(ids, 0)


def test_balance_evens_out_recorded_durations_and_keeps_collection_order():
    ids = ["f::a", "f::b", "f::c", "f::d", "f::e", "f::new"]
    durations = {"f::a": 30.0, "f::b": 1.0, "f::c": 1.0, "f::d": 1.0, "f::e": 27.0}  # f::new weighs the mean, 12
    shards = gpu_tests.shard(ids, 2, durations)
    assert shards == [["f::a", "f::b", "f::c", "f::d"], ["f::e", "f::new"]]  # 33 s and 39 s
    assert gpu_tests.shard(ids, 2) == [ids[:3], ids[3:]]  # by count without durations


def test_merge_takes_the_worst_phase_and_lists_what_did_not_run():
    shards = [["f::a", "f::b"], ["f::c"]]
    reports = [[dict(nodeid="f::a", when="call", outcome="passed", duration=1.0),
                dict(nodeid="f::a", when="teardown", outcome="failed", duration=0.5),
                dict(nodeid="f::b", when="setup", outcome="skipped", duration=0.0)], []]
    m = gpu_tests.merge(shards, reports, ["l0", "l1"])
    assert (m["passed"], m["failed"], m["skipped"], m["not_run"]) == (0, 1, 1, ["f::c"])
    assert m["failures"] == [dict(test="f::a", log="l0")] and m["durations"]["f::a"] == 1.5


def test_the_runner_end_to_end(tmp_path, capsys):
    suite = _suite(tmp_path, sleep=0)
    out = tmp_path / "out"
    rc = gpu_tests.main(["--out", str(out), "--shards", "3", "--rootdir", str(suite), "--interpret", "."])
    s = json.loads((out / "summary.json").read_text())
    assert rc == 1  # a failure
    assert (s["selected"], s["passed"], s["failed"], s["skipped"], s["not_run"]) == (10, 7, 2, 1, [])
    assert sorted(f["test"] for f in s["failures"]) == ["test_suite.py::test_fail",
                                                        "test_suite.py::test_teardown_fails"]
    assert all(Path(f["log"]).exists() for f in s["failures"])
    assert "test_cpu_only" not in json.dumps(s)  # outside the marker
    assert "7 passed, 2 failed, 1 skipped, 0 not run of 10 selected, 3 shards" in capsys.readouterr().out
    # balanced by that run's durations: the same tests, in any number of shards
    previous = tmp_path / "previous.json"
    previous.write_text((out / "summary.json").read_text())
    gpu_tests.main(["--out", str(out), "--shards", "2", "--rootdir", str(suite), "--interpret",
                    "--balance", str(previous), "."])
    s = json.loads((out / "summary.json").read_text())
    assert (s["selected"], s["passed"], s["shards"]) == (10, 7, 2)


def test_a_shard_stopped_at_its_limit_reports_what_it_ran(tmp_path, capsys):
    suite = _suite(tmp_path, sleep=60)
    out = tmp_path / "out"
    rc = gpu_tests.main(["--out", str(out), "--shards", "1", "--timeout", "20", "--rootdir", str(suite),
                         "--interpret", "."])
    s = json.loads((out / "summary.json").read_text())
    assert rc == 1 and s["timed_out_shards"] == [0] and s["seconds"] < 50
    # the test it was in when stopped, and the one after it
    assert s["not_run"] == ["test_suite.py::test_slow", "test_suite.py::test_after_the_slow_one"]
    assert s["passed"] == 5 and s["failed"] == 2
    assert "NOT RUN test_suite.py::test_slow" in capsys.readouterr().out


def test_a_crashed_shard_is_named_and_its_remaining_tests_not_run(tmp_path, capsys):
    """A shard whose process dies (a CUDA error that aborts it, a segfault) is reported with its exit code and
    log; the tests it ran keep their outcomes and the rest are listed as not run."""
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_dies.py").write_text(
        "import os\nimport pytest\n\npytestmark = pytest.mark.gpu\n\n\ndef test_before():\n    pass\n\n\n"
        "def test_dies():\n    os._exit(7)\n\n\ndef test_after():\n    pass\n")
    out = tmp_path / "out"
    rc = gpu_tests.main(["--out", str(out), "--shards", "1", "--rootdir", str(suite), "--interpret", "."])
    s = json.loads((out / "summary.json").read_text())
    assert rc == 1 and s["crashed_shards"] == {"0": 7} and s["timed_out_shards"] == []
    assert s["passed"] == 1 and s["not_run"] == ["test_dies.py::test_dies", "test_dies.py::test_after"]
    assert "shard 0 exited with code 7" in capsys.readouterr().out

"""The benchmark tools that run without a GPU: the Nsight Compute report summary of ``benchmarks.ncu_probe``."""
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

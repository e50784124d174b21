"""pytest plugin for :mod:`benchmarks.gpu_tests`: append each test phase's outcome to a JSON-lines file as soon as
it is known, so that a shard stopped at its time limit still reports what it ran (``--junitxml`` writes only at
the end of a session). The file is named by the ``EVTORCH_TEST_REPORTS`` environment variable; without it the
plugin does nothing."""
from __future__ import annotations

import json
import os


def pytest_runtest_logreport(report):
    path = os.environ.get("EVTORCH_TEST_REPORTS")
    # the call phase always; setup and teardown only when they did not pass (a skip is decided in setup)
    if not path or (report.when != "call" and report.passed):
        return
    with open(path, "a") as fh:
        fh.write(json.dumps(dict(nodeid=report.nodeid, when=report.when, outcome=report.outcome,
                                 duration=report.duration)) + "\n")

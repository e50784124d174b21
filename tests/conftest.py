import os

os.environ.setdefault("TRITON_INTERPRET", "1")
# GPU runs use pytest-xdist (-n 8 to 12): two compile workers per test process keep the tuner's worker-process
# path exercised without starting a hundred CUDA contexts (runtime/compile_pool.py).
os.environ.setdefault("EVTORCH_COMPILE_WORKERS", "2")


import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """GPU tests need the real Triton compiler, which this process cannot have once the interpreter is on
    (Triton decides per @triton.jit function at import). Run them with `TRITON_INTERPRET=0 pytest -m gpu`."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        skip = pytest.mark.skip(reason="GPU test under TRITON_INTERPRET=1; run: TRITON_INTERPRET=0 pytest -m gpu")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)

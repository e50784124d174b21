import os

os.environ.setdefault("TRITON_INTERPRET", "1")


import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """GPU tests need the real Triton compiler, which this process cannot have once the interpreter is on
    (Triton decides per @triton.jit function at import). Run them with `TRITON_INTERPRET=0 pytest -m gpu`."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        skip = pytest.mark.skip(reason="GPU test under TRITON_INTERPRET=1; run: TRITON_INTERPRET=0 pytest -m gpu")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)

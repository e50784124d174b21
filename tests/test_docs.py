"""The documentation runs: every Python block of README.md and docs/*.md, on CPU.

How a document's blocks are read:

- ``python`` blocks run in order, in one namespace per document, in a temporary directory. A line
  ``# requires: cuda`` skips the block without CUDA; ``# requires: some.module`` skips it when that module is
  not importable. A block whose first line is ``# file: NAME.py`` is written to NAME.py instead of run.
- A ``text output`` block right after a python block is what that block prints (compared line by line,
  trailing spaces ignored), so printed IR in the docs cannot drift from what evtorch prints.
- ``console`` blocks: every ``$ evtorch ...`` line runs through ``evtorch.cli.main`` (in the same directory)
  and must exit 0; a trailing ``# requires: ...`` comment skips it as above.

Documents listed in ``SKETCHES`` are not run. Also checked here: README.md opens with exactly two commands
and ``.ci/run`` runs both; local links resolve; docs/epilogues.md names every op a user can call.
"""
from __future__ import annotations

import contextlib
import importlib.util
import io
import linecache
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: documents whose python blocks are sketches, not programs (ARCHITECTURE.md shows a Triton kernel's signature
#: with placeholders); their links are still checked
SKETCHES = {"docs/ARCHITECTURE.md"}
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```[ \t]*$", re.M | re.S)
REQUIRES = re.compile(r"#\s*requires:\s*([\w.]+)")


@dataclass
class Block:
    info: str      # the fence's info string: "python", "text output", "console", ...
    code: str
    line: int      # line of the opening fence, 1-based
    end: int       # offset just past the closing fence

    @property
    def lang(self) -> str:
        return self.info.split()[0] if self.info.split() else ""


def blocks(path: Path) -> list[Block]:
    text = path.read_text()
    return [Block(m.group(1).strip(), m.group(2), text.count("\n", 0, m.start()) + 1, m.end())
            for m in FENCE.finditer(text)]


def missing_requirement(code: str) -> str | None:
    """The first ``# requires:`` of ``code`` this machine lacks, or None."""
    for need in REQUIRES.findall(code):
        if need == "cuda":
            if not torch.cuda.is_available():
                return need
        else:
            try:
                if importlib.util.find_spec(need) is None:
                    return need
            except ModuleNotFoundError:  # a parent package is missing
                return need
    return None


def run_python(block: Block, path: Path, namespace: dict) -> str:
    """Run one block (registered in linecache so tracebacks, evtorch's error locations and ``@triton.jit``'s
    ``inspect.getsource`` see its text); returns what it printed."""
    filename = f"{path.relative_to(ROOT)}:{block.line + 1}"
    linecache.cache[filename] = (len(block.code), None, block.code.splitlines(True), filename)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block.code, filename, "exec"), namespace)
    return out.getvalue()


def run_console(block: Block, path: Path) -> int:
    from evtorch.cli import main
    ran = 0
    for line in block.code.splitlines():
        if not line.startswith("$ evtorch "):
            continue
        if missing_requirement(line):
            continue
        argv = shlex.split(line[len("$ evtorch "):], comments=True)
        with contextlib.redirect_stdout(io.StringIO()) as out:
            rc = main(argv)
        assert rc == 0, f"{path.name}:{block.line}: `{line[2:]}` exited {rc}:\n{out.getvalue()[-3000:]}"
        ran += 1
    return ran


def _same_lines(a: str, b: str) -> bool:
    norm = lambda s: [line.rstrip() for line in s.strip("\n").splitlines()]  # noqa: E731
    return norm(a) == norm(b)


RUNNABLE = [p for p in DOCS if str(p.relative_to(ROOT)) not in SKETCHES]


@pytest.mark.parametrize("path", RUNNABLE, ids=[str(p.relative_to(ROOT)) for p in RUNNABLE])
def test_doc_runs(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": f"doc_{path.stem}"}
    all_blocks = blocks(path)
    ran = skipped = 0
    for i, block in enumerate(all_blocks):
        if block.lang == "console":
            ran += run_console(block, path)
            continue
        if block.lang != "python":
            continue
        first = block.code.lstrip().splitlines()[0] if block.code.strip() else ""
        if first.startswith("# file:"):
            (tmp_path / first.split(":", 1)[1].strip()).write_text(block.code)
            continue
        if missing_requirement(block.code):
            skipped += 1
            continue
        try:
            printed = run_python(block, path, namespace)
        except Exception as e:
            raise AssertionError(f"{path.name}: the python block at line {block.line} failed: "
                                 f"{type(e).__name__}: {e}") from e
        ran += 1
        following = all_blocks[i + 1] if i + 1 < len(all_blocks) else None
        if following is not None and following.info == "text output":
            assert _same_lines(printed, following.code), (
                f"{path.name}: the block at line {block.line} printed\n{printed}\nbut line {following.line} "
                f"shows\n{following.code}")
    if ran == 0 and skipped:
        pytest.skip(f"every block of {path.name} needs something this machine lacks")


def test_doc_blocks_are_found():
    """The fence parser sees the blocks (a broken parser would make the test above pass vacuously)."""
    langs = [b.lang for b in blocks(ROOT / "README.md")]
    assert langs.count("python") >= 1 and langs[0] == "bash"
    assert sum(b.lang == "python" for p in RUNNABLE for b in blocks(p)) >= 10


# ------------------------------------------------------------------------------------------------ README + CI
def readme_commands() -> list[str]:
    first = blocks(ROOT / "README.md")[0]
    return [line for line in first.code.splitlines() if line.strip()]


def test_readme_opens_with_two_commands():
    text = (ROOT / "README.md").read_text()
    before_first_block = text[:text.index("```")]
    assert [line for line in before_first_block.splitlines() if line.strip()] == ["# evtorch"]
    commands = readme_commands()
    assert len(commands) == 2, commands
    assert commands[0].endswith("evtorch demo") and "pytest" in commands[1]


def test_ci_runs_the_readme_commands():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert "set -euo pipefail" in ci
    for command in readme_commands():
        assert command in ci, f".ci/run does not run README's command {command!r}"
    assert ci.index(readme_commands()[1]) == max(i for i, line in enumerate(ci) if line.strip()), \
        "the test command should be .ci/run's last step, so its summary is the last thing CI prints"


# ------------------------------------------------------------------------------------------------ links, ops
def test_local_links_resolve():
    for path in DOCS:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text()):
            if "://" in target:
                continue
            assert (path.parent / target).exists(), f"{path.name} links to {target}, which does not exist"


def test_epilogue_doc_names_every_op():
    from evtorch.ops.registry import REGISTRY
    text = (ROOT / "docs" / "epilogues.md").read_text()
    public = [op for op in REGISTRY.ops.values() if (op.torch_fns or op.methods) and op.user_defined is None]
    missing = [op.name for op in public if f"`{op.name}" not in text and f".{op.name}" not in text]
    assert not missing, f"docs/epilogues.md does not mention these ops: {missing}"


def test_examples_in_docs_match_evtorch_examples():
    """docs/cli.md and README describe the demo's examples by name: keep them in step with evtorch.examples."""
    from evtorch.examples import EXAMPLES
    cli_doc = (ROOT / "docs" / "cli.md").read_text()
    assert [n for n in EXAMPLES if n not in cli_doc] == []


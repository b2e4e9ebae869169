"""docs/workflows.md's examples, run as written in an empty folder: its Python files (each block
that starts with ``# <name>.py``), the worker its console block starts, and the output its
console blocks show. An example that stops working, or prints other than the doc says, fails
here."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.acceptance.test_readme import FENCE, user_env

DOC = Path(__file__).resolve().parents[2] / "docs" / "workflows.md"
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow


def blocks(language: str) -> list[str]:
    return [body for lang, body in FENCE.findall(DOC.read_text()) if lang == language]


def shown_output(command: str) -> list[str]:
    """The lines the doc's console blocks show after ``$ <command>``."""
    for body in blocks("console"):
        lines = body.splitlines()
        if f"$ {command}" in lines:
            shown = []
            for line in lines[lines.index(f"$ {command}") + 1 :]:
                if line.startswith("$ "):
                    break
                shown.append(line)
            return shown
    raise AssertionError(f"no console block runs {command!r}")


def run(argv: list[str], cwd: Path, **env: str) -> str:
    done = subprocess.run(
        argv,
        cwd=cwd,
        env=user_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, (argv, done.stdout, done.stderr)
    return done.stdout


def test_the_workflow_docs_examples_run_and_print_what_they_show(tmp_path: Path) -> None:
    for body in blocks("python"):
        first, _, _ = body.partition("\n")
        match = re.fullmatch(r"# ([\w/]+\.py)", first.strip())
        assert match, first
        path = tmp_path / match.group(1)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
    (tmp_path / "myapp" / "__init__.py").write_text("")
    python = str(BIN / "python")
    nightly = run([python, "nightly.py"], tmp_path).splitlines()
    assert nightly == shown_output("python nightly.py")
    assert len(nightly) == 5
    run([str(BIN / "taskward"), "worker", "--burst"], tmp_path, TASKWARD_IMPORTS="myapp.pipeline")
    total = run(
        [
            python,
            "-c",
            "import asyncio, taskward\n"
            "async def main():\n"
            "    async with taskward.open_db('sqlite:///taskward.db') as db:\n"
            "        row = await db.fetchone('run_get_by_key',"
            " {'idempotency_key': 'nightly:2026-12-05/load'})\n"
            "        print(await taskward.get_task_result(db, row['id']))\n"
            "asyncio.run(main())\n",
        ],
        tmp_path,
    )
    assert total.strip() == "600"
    cascade = run([python, "cascade.py"], tmp_path).splitlines()
    assert cascade == shown_output("python cascade.py")
    assert len(cascade) == 3

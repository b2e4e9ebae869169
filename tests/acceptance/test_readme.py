"""The README's examples, run exactly as written in an empty folder (a new user's first steps):
its Python files (each block that starts with ``# <name>.py``), its shell block and its curl
block against a real ``taskward serve``. A README example that stops working fails here."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
BIN = Path(sys.executable).parent
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)
pytestmark = pytest.mark.slow


def blocks(language: str) -> list[str]:
    return [body for lang, body in FENCE.findall(README.read_text()) if lang == language]


def files() -> dict[str, str]:
    """The README's Python files by name (``# myapp/tasks.py`` on their first line)."""
    named = {}
    for body in blocks("python"):
        first, _, _ = body.partition("\n")
        match = re.fullmatch(r"# ([\w/]+\.py)", first.strip())
        if match:
            named[match.group(1)] = body
    return named


def shell_block(marker: str) -> str:
    [body] = [b for b in blocks("bash") if marker in b]
    return body


def user_env(**extra: str) -> dict[str, str]:
    """A new user's shell: the venv's commands on PATH, none of the test run's TASKWARD_*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TASKWARD_", "PYTEST"))}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', os.defpath)}"
    env.pop("PYTHONPATH", None)
    env.update(extra)
    return env


def run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, (argv, done.stdout, done.stderr)
    return done


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    for name, body in files().items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
    return tmp_path


READ_ID = (
    "import sqlite3; print(sqlite3.connect('taskward.db').execute("
    "\"SELECT id FROM schedule_runs WHERE idempotency_key = 'report:2026-w48'\").fetchone()[0])"
)


def test_the_readme_names_the_files_it_runs() -> None:
    assert {"myapp/tasks.py", "submit.py", "in_transaction.py", "sync_submit.py"} <= set(files())


def test_the_python_and_shell_examples_run_as_written(folder: Path) -> None:
    env = user_env()
    python = str(BIN / "python")
    assert run([python, "submit.py"], folder, env).stdout.split() == ["queued", "0"]
    first = run([python, "-c", READ_ID], folder, env).stdout.strip()
    # R24: in the caller's own transaction, the same key and arguments: the same task
    assert run([python, "in_transaction.py"], folder, env).stdout.strip() == first
    assert run([python, "sync_submit.py"], folder, env).stdout.split() == ["queued"]
    (folder / "first_steps.sh").write_text(shell_block("taskward task submit command"))
    done = run(["bash", "-euo", "pipefail", "first_steps.sh"], folder, env)
    # Every task ran (the key the scripts used admitted one send_report task, not three), the
    # echo task's history was shown and its cancel answered already_terminal.
    assert "already_terminal (status: completed)" in done.stdout
    assert "running -> completed" in done.stdout
    assert "generated idempotency key" in done.stderr
    listed = run(["taskward", "task", "list", "--json"], folder, env).stdout
    rows = json.loads(listed)
    tasks = rows["tasks"] if isinstance(rows, dict) else rows
    # The echo task that depends on the first ran after it (R21), and the tree showed the link.
    assert sorted((t["action_kind"], t["status"]) for t in tasks) == [
        ("command", "completed"),
        ("command", "completed"),
        ("send_report", "completed"),
    ]
    assert "needed by:" in done.stdout


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_curl_examples_run_against_taskward_serve(folder: Path) -> None:
    port = free_port()
    env = user_env(TASKWARD_COMMAND_ALLOWLIST="echo")
    run(["taskward", "migrate"], folder, env)
    serve = subprocess.Popen(
        ["taskward", "serve", "--port", str(port)],
        cwd=folder,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                assert serve.poll() is None, "taskward serve exited"
                assert time.monotonic() < deadline, "taskward serve did not listen"
                time.sleep(0.1)
        lines = shell_block("curl").replace("\\\n", " ").replace("8080", str(port)).splitlines()
        submit, listing, cancel = (line for line in lines if line.strip())
        created = json.loads(run(["bash", "-c", submit], folder, env).stdout)
        assert created["created"] and created["idempotency_key"] == "hi-1"
        again = json.loads(run(["bash", "-c", submit], folder, env).stdout)
        assert again["task_id"] == created["task_id"] and not again["created"]  # the same key
        queued = json.loads(run(["bash", "-c", listing], folder, env).stdout)
        assert [t["id"] for t in queued["tasks"]] == [created["task_id"]]
        answer = json.loads(
            run(["bash", "-c", cancel.replace("ID", created["task_id"])], folder, env).stdout
        )
        assert answer["state"] == "cancelled"
    finally:
        serve.terminate()
        serve.wait(timeout=30)

"""Lean installs (issue 29): submitting and working need no web stack -- ``import taskward``,
the CLI and the worker runtime import neither FastAPI, uvicorn, Jinja2 nor Starlette -- and
``taskward serve`` / ``up`` without the ``server`` extra say which extra to install (exit 1,
no traceback). A fresh virtual environment with the core install alone is checked by hand
(docs/architecture.md "Dependencies"); here the missing modules are blocked in the child."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from taskward.cli.errors import EXIT_FAILURE

WEB = ("fastapi", "uvicorn", "jinja2", "starlette", "itsdangerous", "pydantic_settings")


def python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )


def test_the_worker_path_imports_no_web_stack() -> None:
    done = python(
        "import sys\n"
        "import taskward, taskward.cli.main, taskward.cli.worker_cmd, taskward.runtime\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({WEB!r})))\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_worker_path_loads_no_webhook_client_until_a_webhook_is_made() -> None:
    """httpx, standardwebhooks and http.cookiejar load where a webhook target is made (issue
    27's start-up: ~15 ms a worker that delivers to no webhook never needs)."""
    done = python(
        "import sys\n"
        "import taskward.cli.main, taskward.cli.worker_cmd, taskward.runtime\n"
        "lazy = ('httpx', 'standardwebhooks', 'http.cookiejar')\n"
        "print(sorted(set(lazy) & set(sys.modules)))\n"
        "from taskward.outbox.targets import WebhookTarget\n"
        "WebhookTarget(url='https://example.invalid/hook', secret='s3cret')\n"
        "print(sorted(set(lazy[1:]) & set(sys.modules)))\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["[]", "['standardwebhooks']"]


@pytest.mark.parametrize("command", ["serve", "up"])
def test_serve_without_the_server_extra_names_the_extra(command: str, tmp_path: object) -> None:
    blocked = "".join(f"sys.modules[{name!r}] = None\n" for name in WEB)
    done = python(
        "import sys\n"
        f"{blocked}"
        "from taskward.cli.main import main\n"
        f"sys.exit(main(['--db', 'sqlite:///{tmp_path}/lean.db', {command!r}]))\n"
    )
    assert done.returncode == EXIT_FAILURE, (done.stdout, done.stderr)
    assert "pip install 'taskward[server]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_import_taskward_loads_a_public_name_only_when_it_is_used() -> None:
    """``import taskward`` is cheap (PEP 562, issue 27's start-up): no store, admission or
    pydantic until a name is used; every name in ``__all__`` then resolves to its module's own
    object, and an unknown name is an AttributeError."""
    done = python(
        "import sys, taskward\n"
        "before = sorted(m for m in sys.modules if m.startswith(('taskward.', 'pydantic')))\n"
        "import importlib\n"
        "resolved = all(getattr(taskward, n) is getattr(\n"
        "    importlib.import_module(taskward._MODULE_OF[n]), n) for n in taskward.__all__)\n"
        "missing = not hasattr(taskward, 'no_such_name')\n"
        "print(before, resolved, missing, set(taskward.__all__) <= set(dir(taskward)))\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[]", "True", "True", "True"]


# Submits a task and runs it with a burst worker on a fresh SQLite store, then prints the task's
# status and stored trace context, and which OpenTelemetry modules were imported.
ADMIT_AND_RUN = """
import asyncio, json, sys
import taskward
from taskward.adapters import AdapterConfig, build_registry
from taskward.runtime import WorkerConfig, WorkerRuntime

async def main(url):
    registry = build_registry(AdapterConfig(command_allowlist=frozenset({"true"})))
    app = taskward.TaskApplication(
        action_kind="command", args={"argv": ["true"]}, execution_target="host",
        idempotency_key="lean-otel",
    )
    async with taskward.open_db(url) as db:
        task_id = await taskward.submit_task(db, app, registry=registry)
        config = WorkerConfig(
            concurrency=1, idle_wait_s=0.02, run_scheduler=False, deliver_outbox=False,
            exit_when_idle=True,
        )
        assert await WorkerRuntime(db, registry, config).run() == 0
        row = await taskward.get_task(db, task_id)
    loaded = sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry" and sys.modules[m])
    print(json.dumps([row["status"], row["trace_context"], loaded]))

asyncio.run(main(sys.argv[1]))
"""


@pytest.mark.parametrize("installed", [True, False], ids=["otel-installed", "otel-missing"])
def test_tracing_costs_nothing_until_the_application_imports_opentelemetry(
    installed: bool, tmp_path: Path
) -> None:
    """``taskward[otel]`` is optional: without OpenTelemetry (blocked in the child) admission
    and the worker behave as ever, and with it installed but not imported by the application
    taskward imports none of it (``taskward.tracing`` only looks in ``sys.modules``)."""
    blocked = "" if installed else "sys.modules['opentelemetry'] = None\n"
    code = "import sys\n" + blocked + ADMIT_AND_RUN
    done = subprocess.run(
        [sys.executable, "-c", code, f"sqlite:///{tmp_path}/lean-otel.db"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == ["completed", None, []]

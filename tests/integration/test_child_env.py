"""What a child process sees of the worker's environment: the basics, the deployment's
passthrough and its own ``env``, never taskward's tokens or settings (their output is evidence
every reader sees). Commands and launchers run through the worker runtime over a real store (both
backends); the outbox's local command through a deliverer."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

import taskward
from taskward.adapters import AdapterConfig, build_registry
from taskward.adapters.childenv import (
    CHILD_ENV_BASICS,
    child_environment,
    parse_env_passthrough,
    validate_env_passthrough,
)
from taskward.canonical import canonical_json
from taskward.errors import TaskValidationError
from taskward.outbox import CommandTarget, OutboxConfig, OutboxDeliverer
from taskward.reads import list_task_events
from taskward.registry import TaskAdapterRegistry
from taskward.runtime import WorkerConfig, WorkerRuntime
from taskward.store.port import StateDB
from tests.integration.helpers import move, submit

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX processes")

T0 = 1_000_000.0
SECRETS = {
    "TASKWARD_API_TOKENS": "tok-admin-7f3a:*,tok-reader-19bc:read",
    "TASKWARD_API_TOKENS_FILE": "/etc/taskward/tokens-6d21",
    "TASKWARD_SESSION_SECRET": "session-secret-0c8e",
    "TASKWARD_WEBHOOK_SECRET": "webhook-secret-41aa",
    "TASKWARD_SECRET_X": "made-up-secret-x-55d0",
    "AWS_SECRET": "aws-secret-8b19",
}
PASSED = {"AWS_REGION": "eu-west-3", "MYAPP_COLOUR": "teal", "TASKWARD_TEST_NAMED": "named-ok"}
# Exact names, a prefix pattern, and a taskward variable named in full (allowed by name only).
PASSTHROUGH = "AWS_REGION, MYAPP_*, TASKWARD_TEST_NAMED"
DUMP_ENV = "import json, os; print(json.dumps(dict(os.environ), sort_keys=True))"


@pytest.fixture
def worker_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's environment: secrets, passed-through variables and the passthrough itself."""
    for name, value in {**SECRETS, **PASSED}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TASKWARD_CHILD_ENV_PASSTHROUGH", PASSTHROUGH)
    monkeypatch.setenv("LC_TEST_LOCALE", "C")


def assert_minimal(seen: dict[str, str], *, own: dict[str, str]) -> None:
    """The child saw PATH, its own variables and the passthrough, and no secret at all."""
    assert seen.get("PATH") == os.environ["PATH"]
    assert seen.get("LC_TEST_LOCALE") == "C"  # LC_* is among the basics
    for name, value in {**own, **PASSED}.items():
        assert seen.get(name) == value, name
    assert not set(SECRETS) & set(seen)
    assert "TASKWARD_CHILD_ENV_PASSTHROUGH" not in seen
    # Nothing beyond the basics, the passthrough and its own (LC_* and the like aside).
    extra = set(seen) - set(own) - set(PASSED) - CHILD_ENV_BASICS
    assert all(name.startswith("LC_") for name in extra), extra


def assert_no_secret_in(text: str) -> None:
    for value in SECRETS.values():
        assert value not in text


def parse_env_output(text: str) -> dict[str, str]:
    """``env``'s NAME=value lines."""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


async def run_worker(db: StateDB, registry: TaskAdapterRegistry) -> None:
    """What ``taskward worker --burst`` runs: claim, execute, record, exit once idle."""
    config = WorkerConfig(
        concurrency=2,
        idle_wait_s=0.02,
        cancel_poll_s=0.05,
        reap_interval_s=30.0,
        exit_when_idle=True,
        run_scheduler=False,
        deliver_outbox=False,
    )
    assert await asyncio.wait_for(WorkerRuntime(db, registry, config).run(), 60) == 0


async def submit_to(db: StateDB, registry: TaskAdapterRegistry, kind: str, args: Any) -> str:
    app = taskward.TaskApplication(
        action_kind=kind,
        args=args,
        execution_target="host",
        idempotency_key=f"k-{uuid.uuid4()}",
    )
    return await taskward.submit_task(db, app, registry=registry)


async def stored_output(db: StateDB, task_id: str) -> tuple[str, str]:
    """The task's process output as stored, and everything a reader can see of the task."""
    row = await taskward.get_task(db, task_id)
    assert row["status"] == "completed", row["error_detail"]
    refs = row["status_evidence_refs"]
    refs = json.loads(refs) if isinstance(refs, str) else refs
    tails = [ref["output_tail"] for ref in refs if ref.get("kind") == "process"]
    assert len(tails) == 1, refs
    facts = await taskward.list_transitions(db, task_id)
    events = await list_task_events(db, task_id)
    return tails[0], canonical_json([row, facts, events])


# -- a command and a launcher through the worker ----------------------------------------------


@pytest.mark.usefixtures("worker_env")
async def test_a_command_child_sees_the_basics_its_env_and_the_passthrough_only(
    db: StateDB,
) -> None:
    registry = build_registry(
        AdapterConfig.from_env(command_allowlist=frozenset({"env", "printenv"}))
    )
    own = {"TASK_OWN": "mine", "TASKWARD_FROM_TASK": "the submitter's own"}
    listed = await submit_to(db, registry, "command", {"argv": ["env"], "env": own})
    # printenv with no task env: the path that used to pass env=None (the whole environment).
    bare = await submit_to(db, registry, "command", {"argv": ["printenv"]})
    asked = await submit_to(
        db, registry, "command", {"argv": ["printenv", "TASKWARD_API_TOKENS", "AWS_SECRET"]}
    )
    await run_worker(db, registry)

    output, everything = await stored_output(db, listed)
    assert_minimal(parse_env_output(output), own=own)
    assert_no_secret_in(everything)

    output, everything = await stored_output(db, bare)
    assert_minimal(parse_env_output(output), own={})
    assert_no_secret_in(everything)

    row = await taskward.get_task(db, asked)
    assert row["status"] == "failed" and row["exit_code"] == 1  # printenv: not set
    assert_no_secret_in(canonical_json(row))


@pytest.mark.usefixtures("worker_env")
async def test_a_launcher_child_gets_the_same_minimal_environment(
    db: StateDB, tmp_path: Path
) -> None:
    launcher = tmp_path / "fake-li"
    launcher.write_text(f"#!{sys.executable}\n{DUMP_ENV}\n")
    launcher.chmod(0o755)
    registry = build_registry(AdapterConfig.from_env(launcher=str(launcher)))
    own = {"LAUNCH_OWN": "yes"}
    task_id = await submit_to(db, registry, "agent", {"objective": "x", "env": own})
    await run_worker(db, registry)
    output, everything = await stored_output(db, task_id)
    assert_minimal(json.loads(output), own=own)
    assert_no_secret_in(everything)


async def test_a_workflow_step_gets_the_same_minimal_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Adapter-level (a workflow needs a library, not a store, to show this)."""
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_REGION", "eu-west-3")
    from taskward import CancellationToken
    from taskward.adapters.workflow import content_hash_of

    body = json.dumps({"steps": [{"argv": [sys.executable, "-c", DUMP_ENV]}]}).encode()
    (tmp_path / "lib" / "dump").mkdir(parents=True)
    (tmp_path / "lib" / "dump" / "1.json").write_bytes(body)
    registry = build_registry(
        AdapterConfig(workflow_library=tmp_path / "lib", child_env_passthrough=("AWS_REGION",))
    )
    _, adapter = registry.resolve("workflow")
    task = {
        "id": "t-1",
        "action_kind": "workflow",
        "action_args": {},
        "library_ref": "dump@1",
        "library_content_hash": content_hash_of(body),
    }
    result = await adapter.execute(task, cancellation=CancellationToken())
    assert result.status == "completed", result.error_detail
    (tail,) = [ref["output_tail"] for ref in result.evidence_refs if ref.get("kind") == "process"]
    seen = json.loads(tail)
    assert seen["AWS_REGION"] == "eu-west-3" and seen["PATH"] == os.environ["PATH"]
    assert not set(SECRETS) & set(seen)


# -- the outbox's local command ---------------------------------------------------------------


@pytest.mark.usefixtures("worker_env")
async def test_an_outbox_command_sees_the_minimal_environment_and_its_notification(
    db: StateDB, tmp_path: Path
) -> None:
    task_id = await submit(db, now=T0)
    await move(db, task_id, "queued", "skipped", now=T0)
    out = tmp_path / "env.json"
    script = tmp_path / "notify.py"
    script.write_text(
        "import json, os, sys\nsys.stdin.buffer.read()\n"
        "open(sys.argv[1], 'w').write(json.dumps(dict(os.environ)))\n"
    )
    argv = [sys.executable, str(script), str(out)]
    # The worker's environment as the runtime reads it (with the passthrough of worker_env).
    config = OutboxConfig.from_env({**os.environ, "TASKWARD_NOTIFY_COMMAND": json.dumps(argv)})
    (target,) = config.targets
    assert isinstance(target, CommandTarget)
    deliverer = OutboxDeliverer(db, config, owner="deliverer-a")
    assert (await deliverer.run_once(now=T0))["delivered"] == 1
    seen = json.loads(out.read_text())
    notification = {
        name: seen[name]
        for name in (
            "TASKWARD_NOTIFICATION_ID",
            "TASKWARD_NOTIFICATION_KIND",
            "TASKWARD_NOTIFICATION_DEDUP_KEY",
            "TASKWARD_NOTIFICATION_ATTEMPT",
        )
    }
    assert notification["TASKWARD_NOTIFICATION_ATTEMPT"] == "1"
    assert_minimal(seen, own=notification)
    assert "TASKWARD_NOTIFY_COMMAND" not in seen


# -- the rules ---------------------------------------------------------------------------------


def test_child_environment_rules() -> None:
    worker = {
        "PATH": "/usr/bin",
        "HOME": "/home/w",
        "LC_ALL": "C.UTF-8",
        "TASKWARD_DATABASE_URL": "postgresql://u:pw@db/x",
        "TASKWARD_API_TOKENS": "t:*",
        "AWS_REGION": "r",
        "AWS_SECRET": "s",
        "PGPASSWORD": "pw",
    }
    assert child_environment(None, environ=worker) == {
        "PATH": "/usr/bin",
        "HOME": "/home/w",
        "LC_ALL": "C.UTF-8",
    }
    # A pattern never matches a TASKWARD_* setting; a name given in full does; NEVER_PASSED is
    # dropped even if it reaches child_environment unchecked.
    got = child_environment(
        {"PATH": "/task/bin", "X": "1"},
        ("AWS_REG*", "T*", "TASKWARD_DATABASE_URL", "TASKWARD_API_TOKENS"),
        environ=worker,
    )
    assert got == {
        "PATH": "/task/bin",  # the task's own env wins
        "HOME": "/home/w",
        "LC_ALL": "C.UTF-8",
        "AWS_REGION": "r",
        "TASKWARD_DATABASE_URL": "postgresql://u:pw@db/x",
        "X": "1",
    }


@pytest.mark.parametrize(
    "bad",
    ["*", "TASKWARD_*", "TASKWARD_API_TOKENS", "TASKWARD_API_TOKENS_FILE", "A-B", "1X", "A*B"],
)
def test_a_bad_passthrough_stops_start_up_naming_the_setting(bad: str) -> None:
    with pytest.raises(TaskValidationError) as caught:
        AdapterConfig.from_env({"TASKWARD_CHILD_ENV_PASSTHROUGH": f"PATH_EXTRA,{bad}"})
    assert caught.value.field == "TASKWARD_CHILD_ENV_PASSTHROUGH"
    with pytest.raises(TaskValidationError):
        OutboxConfig.from_env(
            {"TASKWARD_NOTIFY_COMMAND": '["/bin/true"]', "TASKWARD_CHILD_ENV_PASSTHROUGH": bad}
        )
    with pytest.raises(TaskValidationError):
        validate_env_passthrough([bad])


def test_the_passthrough_is_read_with_the_other_adapter_settings() -> None:
    assert AdapterConfig.from_env({}).child_env_passthrough == ()
    config = AdapterConfig.from_env({"TASKWARD_CHILD_ENV_PASSTHROUGH": " AWS_* ; HTTPS_PROXY,"})
    assert config.child_env_passthrough == ("AWS_*", "HTTPS_PROXY")
    assert parse_env_passthrough(None) == ()

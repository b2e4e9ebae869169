"""A new SQLite store and its -wal and -shm files are private to their owner (0600): they hold
task args. An existing file keeps the mode its operator gave it."""

from __future__ import annotations

import os
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import taskward
from taskward.adapters import AdapterConfig, build_registry

REGISTRY = build_registry(AdapterConfig(command_allowlist=frozenset({"true"})))


@pytest.fixture
def usual_umask() -> Iterator[None]:
    previous = os.umask(0o022)  # files would be 0644 without the store's own mode
    yield
    os.umask(previous)


def app() -> taskward.TaskApplication:
    return taskward.TaskApplication(
        action_kind="command",
        args={"argv": ["true"], "env": {"TOKEN": "s3cret"}},
        execution_target="host",
        idempotency_key=f"k-{uuid.uuid4()}",
    )


def modes(path: Path) -> dict[str, int]:
    return {
        suffix: stat.S_IMODE(os.stat(f"{path}{suffix}").st_mode)
        for suffix in ("", "-wal", "-shm")
        if os.path.exists(f"{path}{suffix}")
    }


async def test_a_new_store_and_its_wal_and_shm_are_0600(tmp_path: Path, usual_umask: None) -> None:
    path = tmp_path / "new.db"
    async with taskward.open_db(f"sqlite:///{path}") as db:
        await taskward.submit_task(db, app(), registry=REGISTRY)
        found = modes(path)
        assert set(found) == {"", "-wal", "-shm"}
        assert found == {"": 0o600, "-wal": 0o600, "-shm": 0o600}


def test_a_store_the_sync_client_creates_is_0600(tmp_path: Path, usual_umask: None) -> None:
    path = tmp_path / "sync.db"
    with taskward.SyncClient(f"sqlite:///{path}", registry=REGISTRY) as client:
        client.submit_task(app())
        assert set(modes(path).values()) == {0o600}


async def test_an_existing_file_keeps_its_mode(tmp_path: Path, usual_umask: None) -> None:
    path = tmp_path / "shared.db"
    path.touch(mode=0o640)
    os.chmod(path, 0o640)
    async with taskward.open_db(f"sqlite:///{path}") as db:
        await taskward.submit_task(db, app(), registry=REGISTRY)
        assert modes(path)[""] == 0o640

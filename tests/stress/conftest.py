"""Fixtures of the store-under-stress tests: a private PostgreSQL cluster and store outages.

``pg_cluster`` is created once per session in a temporary directory on a free port and removed at
the end, so stopping or restarting it never disturbs the shared test server. Where it cannot be
created the PostgreSQL cases fail under ``CI=true`` and skip, saying why, elsewhere.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.stress.cluster import PrivateCluster, create_cluster


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PrivateCluster]:
    try:
        cluster = create_cluster()
    except Exception as exc:
        reason = f"cannot create a private PostgreSQL cluster: {exc}"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    try:
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture
def pg_schema(pg_cluster: PrivateCluster) -> str:
    """A fresh store (schema) in the private cluster, started again if a test left it down."""
    if not pg_cluster.is_running():
        pg_cluster.start()
    return pg_cluster.create_schema()


@dataclass
class Outage:
    """Takes a store away and brings it back. Blocking: call through ``asyncio.to_thread``."""

    backend: str
    url: str
    sqlite_path: Path | None = None
    cluster: PrivateCluster | None = None
    _holder: sqlite3.Connection | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    count: int = 0

    def begin(self) -> None:
        """SQLite: another connection holds ``BEGIN EXCLUSIVE`` (longer than the store's lock
        budget). PostgreSQL: the server stops at once (``-m immediate``)."""
        with self._lock:
            self.count += 1
            if self.backend == "sqlite":
                assert self.sqlite_path is not None and self._holder is None
                conn = sqlite3.connect(
                    self.sqlite_path, timeout=30, isolation_level=None, check_same_thread=False
                )
                conn.execute("BEGIN EXCLUSIVE")
                self._holder = conn
            else:
                assert self.cluster is not None
                self.cluster.stop("immediate")

    def end(self) -> None:
        with self._lock:
            if self.backend == "sqlite":
                if self._holder is not None:
                    self._holder.execute("ROLLBACK")
                    self._holder.close()
                    self._holder = None
            else:
                assert self.cluster is not None
                self.cluster.start()

    def flap(self) -> int:
        """A short fault: SQLite locked for 0.3 s; PostgreSQL's sessions terminated."""
        if self.backend == "sqlite":
            self.begin()
            threading.Event().wait(0.3)
            self.end()
            return 1
        assert self.cluster is not None
        self.count += 1
        return self.cluster.terminate_backends()


@pytest.fixture(params=["sqlite", "postgres"])
def outage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Outage]:
    """A store URL on a backend that can be taken away, with the means to do it."""
    if request.param == "sqlite":
        path = tmp_path / "stress.db"
        # A lock budget far below the outages, so they really are outages (StoreUnavailable).
        yield Outage("sqlite", f"sqlite:///{path}?lock_timeout_s=0.2", sqlite_path=path)
        return
    cluster: PrivateCluster = request.getfixturevalue("pg_cluster")
    schema: str = request.getfixturevalue("pg_schema")
    out = Outage(
        "postgres",
        cluster.url(schema, open_timeout_s=0.3, application_name="tw-stress"),
        cluster=cluster,
    )
    try:
        yield out
    finally:
        if not cluster.is_running():
            cluster.start()

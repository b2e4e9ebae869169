"""The store conformance suite's own fixture: a store no other test can signal.

PostgreSQL's notifications are per database, not per schema: the ``db`` fixture's fresh schema
shares ``taskward_queued`` with every other test using the server, so a test that a wake-up did
*not* arrive (or arrived from this test's own write) gets a schema in a database of its own,
made once per session (dropping a database costs seconds; a schema, milliseconds). The tests of
one session run one after another, so only the running test's stores notify there.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
import pytest

from tests.conftest import PG_URL, StoreFactory


class _QuietDatabase:
    """A PostgreSQL database of this session's alone, created on first use."""

    def __init__(self) -> None:
        self.name: str | None = None

    def url(self) -> str:
        if self.name is None:
            name = f"tw_quiet_{uuid.uuid4().hex[:12]}"
            with psycopg.connect(PG_URL, autocommit=True) as conn:
                conn.execute(f"CREATE DATABASE {name}")
            self.name = name
        return urlunsplit(urlsplit(PG_URL)._replace(path=f"/{self.name}", query=""))

    def drop(self) -> None:
        if self.name is not None:
            with psycopg.connect(PG_URL, autocommit=True) as conn:
                conn.execute(f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)")


@pytest.fixture(scope="session")
def _quiet_database() -> Iterator[_QuietDatabase]:
    database = _QuietDatabase()
    yield database
    database.drop()


@pytest.fixture
def quiet_url(backend: str, stores: StoreFactory, _quiet_database: _QuietDatabase) -> Iterator[str]:
    """A fresh store's URL whose notifications reach only the stores opened on it."""
    if backend == "sqlite":
        yield stores.new_url()
        return
    base = _quiet_database.url()
    schema = f"tw_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield f"{base}?options={quote(f'-csearch_path={schema}')}"
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")

"""Property-based tests of the HTTP API from its own OpenAPI document (schemathesis).

A real uvicorn serves the app on 127.0.0.1 (one per backend); for every operation, schemathesis
generates a bounded, deterministic set of schema-valid and schema-invalid requests. Every
answer must be documented, well-formed and never a 5xx, and a rejected request (any 4xx) must
leave the store exactly as it was: no run row and no transition fact.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
import requests
import schemathesis
import uvicorn
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

import taskward
from taskward.http import HttpConfig, create_app
from taskward.web.config import parse_tokens
from tests.conftest import _PG_PROBLEM, PG_URL, pg_schema_url

MAX_EXAMPLES = 25
# Operations with little input to vary (no body, or only a path id) need fewer examples.
FEW_EXAMPLES = 10
TOKEN = "schemathesis-token-0123456789"
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
POSITIVE, NEGATIVE = GenerationMode.POSITIVE, GenerationMode.NEGATIVE
# (operation, generation mode): negative cases only where there is an input to break.
CASES = [
    ("POST /api/tasks", POSITIVE),
    ("POST /api/tasks", NEGATIVE),
    ("GET /api/tasks", POSITIVE),
    ("GET /api/tasks", NEGATIVE),
    ("GET /api/tasks/{task_id}", POSITIVE),
    ("GET /api/tasks/{task_id}/transitions", POSITIVE),
    ("POST /api/tasks/{task_id}/cancel", POSITIVE),
    ("POST /api/tasks/{task_id}/cancel", NEGATIVE),
    ("GET /api/workers", POSITIVE),
    ("GET /api/workers", NEGATIVE),
    ("GET /healthz", POSITIVE),
    ("GET /metrics", POSITIVE),
    ("POST /api/schedules", POSITIVE),
    ("POST /api/schedules", NEGATIVE),
    ("GET /api/schedules", POSITIVE),
    ("GET /api/schedules/{schedule_ref}", POSITIVE),
    ("POST /api/schedules/{schedule_ref}/fire", POSITIVE),
    ("POST /api/schedules/{schedule_ref}/disable", POSITIVE),
    ("POST /api/schedules/{schedule_ref}/enable", POSITIVE),
    ("POST /api/schedules/{schedule_ref}/remove", POSITIVE),
    ("GET /api/outbox", POSITIVE),
    ("GET /api/outbox", NEGATIVE),
    ("GET /api/outbox/{notification_id}", POSITIVE),
    ("POST /api/outbox/{notification_id}/retry", POSITIVE),
]
# Operations that may write when they succeed (a 4xx from any of them must write nothing).
WRITES = {
    "POST /api/tasks",
    "POST /api/tasks/{task_id}/cancel",
    "POST /api/schedules",
    "POST /api/schedules/{schedule_ref}/fire",
    "POST /api/schedules/{schedule_ref}/disable",
    "POST /api/schedules/{schedule_ref}/enable",
    "POST /api/schedules/{schedule_ref}/remove",
    "POST /api/outbox/{notification_id}/retry",
}


@dataclass
class Service:
    base_url: str
    session: requests.Session
    schema: schemathesis.BaseSchema
    count: Callable[[], tuple[int, ...]]  # rows of every table a request may write
    known: dict[str, str]  # a path parameter -> an id that exists


# A fingerprint of everything a request could write: row counts, plus the columns an operation
# changes in place (a schedule's state, a notification's status).
FINGERPRINT = (
    "SELECT count(*) FROM schedule_runs",
    "SELECT count(*) FROM status_transitions",
    "SELECT count(*) FROM task_events",
    "SELECT count(*) FROM schedules",
    "SELECT count(*) FROM schedules WHERE enabled",
    "SELECT count(*) FROM schedules WHERE removed_at IS NOT NULL",
    "SELECT count(*) FROM dispatch_outbox WHERE status = 'pending'",
)


def _counter(execute: Callable[[str], Any]) -> Callable[[], tuple[int, ...]]:
    def count() -> tuple[int, ...]:
        return tuple(int(execute(sql)[0]) for sql in FINGERPRINT)

    return count


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def service(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    cleanup: list[Callable[[], None]] = []
    count: Callable[[], tuple[int, ...]] | None = None
    path = tmp_path_factory.mktemp("schemathesis") / "tw.db"
    if request.param == "sqlite":
        url = f"sqlite:///{path}"
    else:
        if _PG_PROBLEM:
            if os.environ.get("CI") == "true":
                pytest.fail(_PG_PROBLEM)
            pytest.skip(_PG_PROBLEM)
        schema_name = f"tw_{uuid.uuid4().hex[:12]}"
        admin = psycopg.connect(PG_URL, autocommit=True)
        admin.execute(f"CREATE SCHEMA {schema_name}")
        url = pg_schema_url(schema_name)
        reader = psycopg.connect(url, autocommit=True)
        count = _counter(lambda sql: reader.execute(sql).fetchone())

        def drop() -> None:
            reader.close()
            admin.execute(f"DROP SCHEMA IF EXISTS {schema_name} CASCADE")
            admin.close()

        cleanup.append(drop)
    registry = taskward.build_registry(
        taskward.AdapterConfig(command_allowlist=frozenset({"echo"}))
    )
    config = HttpConfig(tokens=parse_tokens([f"fuzz:{TOKEN}:*"]))
    app = create_app(url, registry, config)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="error", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started, "uvicorn did not start"
    base_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {TOKEN}"
    known = session.post(
        f"{base_url}/api/tasks",
        json={"action_kind": "command", "args": {"argv": ["echo", "known"]}},
        timeout=10,
    )
    assert known.status_code == 201, known.text
    if count is None:  # SQLite: read the file the service has created and migrated
        reader_conn = sqlite3.connect(path, check_same_thread=False)
        cleanup.insert(0, reader_conn.close)
        count = _counter(lambda sql: reader_conn.execute(sql).fetchone())
    cancelled = session.post(
        f"{base_url}/api/tasks",
        json={"action_kind": "command", "args": {"argv": ["echo", "cancelled"]}},
        timeout=10,
    ).json()["task_id"]
    session.post(f"{base_url}/api/tasks/{cancelled}/cancel", timeout=10)
    notification = session.get(f"{base_url}/api/outbox", timeout=10).json()["notifications"][0]
    schedule = session.post(
        f"{base_url}/api/schedules",
        json={"name": "known", "action_kind": "command", "args": {"argv": ["echo"]},
              "interval_s": 3600},
        timeout=10,
    )  # fmt: skip
    assert schedule.status_code == 201, schedule.text
    document = session.get(f"{base_url}/openapi.json", timeout=10).json()
    try:
        yield Service(
            base_url=base_url,
            session=session,
            schema=schemathesis.openapi.from_dict(document),
            count=count,
            known={
                "task_id": known.json()["task_id"],
                "schedule_ref": schedule.json()["id"],
                "notification_id": notification["id"],
            },
        )
    finally:
        server.should_exit = True
        thread.join(timeout=20)
        sock.close()
        for step in cleanup:
            step()


@pytest.mark.parametrize(("label", "mode"), CASES, ids=[f"{op} {m.value}" for op, m in CASES])
def test_generated_requests_never_fail_the_server_and_rejections_store_nothing(
    service: Service, label: str, mode: GenerationMode
) -> None:
    operation = service.schema.find_operation_by_label(label)
    assert operation is not None, label
    strategy = operation.as_strategy(generation_mode=mode)
    for name, value in service.known.items():
        if "{" + name + "}" in label:
            # Half the examples aim at a row that exists, so the 2xx paths run too.
            strategy = strategy | operation.as_strategy(
                generation_mode=mode, path_parameters={name: value}
            )
    headers = {"Authorization": f"Bearer {TOKEN}"}

    varied = mode is NEGATIVE or label in {
        "POST /api/tasks",
        "GET /api/tasks",
        "POST /api/tasks/{task_id}/cancel",
        "POST /api/schedules",
        "POST /api/schedules/{schedule_ref}/fire",
    }

    @settings(
        max_examples=MAX_EXAMPLES if varied else FEW_EXAMPLES,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def run(case: schemathesis.Case) -> None:
        before = service.count()
        response = case.call(
            base_url=service.base_url, session=service.session, headers=headers, timeout=10
        )
        case.validate_response(response, checks=CHECKS, headers=headers)
        after = service.count()
        if response.status_code >= 400:
            assert after == before, (
                f"{label} answered {response.status_code} but changed the store "
                f"{before} -> {after}: {response.text[:300]}"
            )
        elif label == "POST /api/tasks":
            assert after[0] - before[0] == (1 if response.status_code == 201 else 0)
        elif label not in WRITES:
            assert after == before, f"{label} is a read but changed the store"

    run()

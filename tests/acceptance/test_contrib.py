"""Framework integrations (issue 29) against real applications, on both backends:
``taskward.contrib.django`` in a configured Django project (its own process: Django's settings
are process-wide) and ``taskward.contrib.fastapi`` in a FastAPI application."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import httpx
import pytest
from fastapi import Depends, FastAPI

import taskward
from taskward.contrib.fastapi import TaskwardLifespan, mount, store
from taskward.store.port import StateDB
from tests.acceptance.test_docs_transactions import _raw, django_database
from tests.acceptance.test_readme import user_env
from tests.fixtures.typed_tasks import weekly

BIN = Path(sys.executable).parent
ROOT = str(Path(__file__).resolve().parents[2])
pytestmark = pytest.mark.slow

TASKS = """
import taskward


@taskward.task()
def send_receipt(order_id: str) -> str:
    return f"receipt for {order_id}"
"""

DJANGO_PROJECT = """
import json, sys
import django
from django.conf import settings

settings.configure(
    INSTALLED_APPS=["taskward.contrib.django"],
    DATABASES={"default": json.loads(sys.argv[1])},
    TASKWARD={"DATABASE_URL": sys.argv[2], "IMPORTS": ["shop.tasks"]},
)
django.setup()
from django.core.management import execute_from_command_line
from django.db import connection, transaction

from shop.tasks import send_receipt
from taskward import TaskApplication
from taskward.contrib.django import submit_task


def receipt(order_id):
    return TaskApplication(action_kind="send_receipt", args={"order_id": order_id},
                           execution_target="host", idempotency_key=f"receipt:{order_id}")


with transaction.atomic():
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO orders (id) VALUES ('d-1')")
    kept = submit_task(receipt("d-1"))
try:
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO orders (id) VALUES ('d-2')")
        submit_task(receipt("d-2"))
        raise RuntimeError("payment refused")
except RuntimeError:
    pass
with transaction.atomic():
    typed = send_receipt.submit_sync(connection, key="receipt:d-3", order_id="d-3")
print(json.dumps({"kept": kept, "typed": typed}))
sys.stdout.flush()
try:
    execute_from_command_line(["manage.py", "taskward_worker", "--burst", "--concurrency", "2"])
except SystemExit as done:
    print(json.dumps({"worker_exit": done.code}))
"""


async def test_a_django_project_submits_in_its_transactions_and_runs_the_worker_command(
    db: StateDB, db_url: str, tmp_path: Path
) -> None:
    _raw(db_url)("CREATE TABLE orders (id TEXT PRIMARY KEY)")
    (tmp_path / "shop").mkdir()
    (tmp_path / "shop" / "__init__.py").write_text("")
    (tmp_path / "shop" / "tasks.py").write_text(TASKS)
    done = subprocess.run(
        [str(BIN / "python"), "-c", DJANGO_PROJECT, json.dumps(django_database(db_url)), db_url],
        cwd=tmp_path,
        env=user_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, (done.stdout, done.stderr)
    first, last = (json.loads(line) for line in done.stdout.splitlines()[-2:])
    assert last == {"worker_exit": 0}, done.stderr
    for task_id in (first["kept"], first["typed"]):
        assert (await taskward.get_task(db, task_id))["status"] == "completed"
    assert await taskward.get_task_result(db, first["typed"]) == "receipt for d-3"
    assert await db.fetchone("run_get_by_key", {"idempotency_key": "receipt:d-2"}) is None
    assert {row[0] for row in _raw(db_url)("SELECT id FROM orders")} == {"d-1"}


async def test_a_fastapi_application_opens_the_store_and_mounts_the_api(
    db_url: str, tmp_path: Path
) -> None:
    lifespan = TaskwardLifespan(db_url)
    app = FastAPI(lifespan=lifespan)
    mount(app, lifespan, path="/taskward")

    @app.post("/reports/{week}")
    async def report(week: int, db: Annotated[StateDB, Depends(store)]) -> dict[str, str]:
        return {"task": await weekly.submit(db, key=f"report:{week}", week=week)}

    async with lifespan(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            created = (await client.post("/reports/49")).json()["task"]
            shown = await client.get(f"/taskward/api/tasks/{created}")
            assert shown.status_code == 200, shown.text
            assert shown.json()["action_args"] == {"week": 49}
            listed = await client.get("/taskward/api/tasks")
            assert [t["id"] for t in listed.json()["tasks"]] == [created]
            assert (await client.get("/taskward/openapi.json")).status_code == 200
    assert lifespan.db is None  # closed with the application

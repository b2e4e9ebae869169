"""docs/transactions.md's worked examples (R24), run as written on both backends: the Django
view and the FastAPI + SQLAlchemy endpoint, each in a fresh Python process (Django's settings
are process-wide) in an empty folder holding the doc's files, against a migrated store.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

from taskward.store.port import StateDB
from tests.acceptance.test_readme import FENCE, user_env

DOC = Path(__file__).resolve().parents[2] / "docs" / "transactions.md"
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow

DJANGO_DRIVER = """
import json, sys
import django
from django.conf import settings

settings.configure(DATABASES={"default": json.loads(sys.argv[1])}, ALLOWED_HOSTS=["*"])
django.setup()
from django.test import RequestFactory

from shop.views import place_order

factory = RequestFactory()
print(place_order(factory.post("/orders/o-1"), "o-1").content.decode())
try:
    place_order(factory.post("/orders/bad-1"), "bad-1")
except ValueError as exc:
    print("refused:", exc)
"""

FASTAPI_DRIVER = """
from fastapi.testclient import TestClient

from shop.api import app

print(TestClient(app).post("/orders/f-1").text)
"""


def write_examples(folder: Path, engine_url: str) -> None:
    for lang, body in FENCE.findall(DOC.read_text()):
        first = body.partition("\n")[0].strip()
        match = re.fullmatch(r"# ([\w/]+\.py)", first)
        if lang != "python" or not match:
            continue
        path = folder / match.group(1)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body.replace('"sqlite:///taskward.db"', repr(engine_url)))
    (folder / "shop" / "__init__.py").write_text("")


def django_database(db_url: str) -> dict[str, object]:
    if db_url.startswith("sqlite"):
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": db_url.removeprefix("sqlite:///")}
    parts = urlsplit(db_url)
    options = parse_qs(parts.query).get("options", [""])[0]
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": parts.path.lstrip("/"),
        "USER": parts.username or "",
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or 5432),
        "OPTIONS": {"options": unquote(options)},
    }


def run(argv: list[str], cwd: Path) -> str:
    done = subprocess.run(
        argv, cwd=cwd, env=user_env(), capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, (argv, done.stdout, done.stderr)
    return done.stdout


async def test_the_django_view_and_the_fastapi_endpoint_admit_with_their_transactions(
    db: StateDB, db_url: str, tmp_path: Path
) -> None:
    raw = _raw(db_url)
    raw("CREATE TABLE orders (id TEXT PRIMARY KEY)")  # the shop's own table, beside the store's
    engine_url = (
        f"sqlite:///{db_url.removeprefix('sqlite:///')}"
        if db_url.startswith("sqlite")
        else db_url.replace("postgresql://", "postgresql+psycopg://", 1)
    )
    write_examples(tmp_path, engine_url)
    python = str(BIN / "python")

    django_out = run([python, "-c", DJANGO_DRIVER, json.dumps(django_database(db_url))], tmp_path)
    lines = django_out.splitlines()
    assert json.loads(lines[0])["order"] == "o-1"
    assert lines[1] == "refused: payment refused"

    fastapi_out = json.loads(run([python, "-c", FASTAPI_DRIVER], tmp_path))
    assert fastapi_out["order"] == "f-1"

    orders = {row[0] for row in raw("SELECT id FROM orders")}
    assert orders == {"o-1", "f-1"}  # bad-1's order rolled back with its task
    for key, task_id in (
        ("receipt:o-1", json.loads(lines[0])["receipt_task"]),
        ("receipt:f-1", fastapi_out["receipt_task"]),
    ):
        row = await db.fetchone("run_get_by_key", {"idempotency_key": key})
        assert row is not None and row["id"] == task_id
    assert await db.fetchone("run_get_by_key", {"idempotency_key": "receipt:bad-1"}) is None


def _raw(db_url: str) -> Callable[[str], list[tuple[object, ...]]]:
    """A statement runner on the store's database, committed at once."""
    if db_url.startswith("sqlite"):
        import sqlite3

        def run_sqlite(sql: str) -> list[tuple[object, ...]]:
            with sqlite3.connect(db_url.removeprefix("sqlite:///")) as conn:
                return conn.execute(sql).fetchall()

        return run_sqlite
    import psycopg

    def run_pg(sql: str) -> list[tuple[object, ...]]:
        with psycopg.connect(db_url, autocommit=True) as conn:
            cur = conn.execute(sql)
            return cur.fetchall() if cur.description else []

    return run_pg

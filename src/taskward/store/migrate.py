"""Versioned, forward-only SQL migrations per dialect: ``<dialect>/migrations/NNNN_name.sql``.

Applied in order under a lock (several workers start at once), each in its own transaction
together with its row in ``taskward_migrations``. A second run is a no-op.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

MIGRATIONS_TABLE = "taskward_migrations"


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def load_migrations(dialect: str) -> list[Migration]:
    """All migrations of ``dialect`` in version order; the numbering must be gap-free."""
    folder = resources.files("taskward.store").joinpath(dialect, "migrations")
    found: list[Migration] = []
    for entry in folder.iterdir():
        match = _FILE.match(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), match.group(2), entry.read_text("utf-8")))
    found.sort(key=lambda m: m.version)
    for expected, migration in enumerate(found, start=1):
        if migration.version != expected:
            raise RuntimeError(f"{dialect} migrations are not gap-free at {migration.version:04d}")
    return found

"""Load a dialect's ``queries.sql``: named blocks (``-- name: x``) into a dict, once.

Both dialects are written with ``:name`` binds; PostgreSQL's are rewritten to psycopg's
``%(name)s`` here, leaving ``::type`` casts alone. On PostgreSQL ``:now`` becomes
``COALESCE(:now, <server transaction time>)``: a statement run on its own with no injected time
uses the server clock, read once for it (R9), without a separate round trip.
"""

from __future__ import annotations

import re
from functools import cache, lru_cache
from importlib import resources

_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$")
_BIND = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")
_PG_NOW = "COALESCE(%(now)s::float8, extract(epoch FROM now())::float8)"


def parse_queries(text: str) -> dict[str, str]:
    """Split a queries file into ``{name: sql}``; comments inside a block are kept."""
    queries: dict[str, str] = {}
    name: str | None = None
    lines: list[str] = []
    for line in text.splitlines():
        match = _NAME.match(line)
        if match:
            if name is not None:
                queries[name] = "\n".join(lines).strip()
            name = match.group(1)
            if name in queries:
                raise ValueError(f"query {name!r} is defined twice")
            lines = []
        elif name is not None:
            lines.append(line)
    if name is not None:
        queries[name] = "\n".join(lines).strip()
    return queries


@lru_cache(maxsize=1024)
def to_pyformat(sql: str, *, binary: bool = False) -> str:
    """``:name`` -> ``%(name)s`` for psycopg (``%(name)b``, sent in binary, with ``binary``); a
    literal ``%`` is doubled. Cached: the guarded updates are built per call but come in a
    handful of shapes."""
    return _BIND.sub(r"%(\1)b" if binary else r"%(\1)s", sql.replace("%", "%%"))


@cache
def load_queries(dialect: str) -> dict[str, str]:
    text = resources.files("taskward.store").joinpath(dialect, "queries.sql").read_text("utf-8")
    queries = parse_queries(text)
    if dialect == "postgres":
        return {name: to_pyformat(sql).replace("%(now)s", _PG_NOW) for name, sql in queries.items()}
    return queries

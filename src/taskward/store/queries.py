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
def to_pyformat(sql: str) -> str:
    """``:name`` -> ``%(name)s`` for psycopg; a literal ``%`` is doubled. Cached: the guarded
    updates are built per call but come in a handful of shapes. (Array parameters travel in
    binary whatever the placeholder: ``store.pgarrays`` values have only a binary dumper.)"""
    return _BIND.sub(r"%(\1)s", sql.replace("%", "%%"))


@lru_cache(maxsize=256)
def to_positional(sql: str) -> tuple[str, tuple[str, ...]]:
    """``:name`` -> ``?N`` for SQLite, numbered in order of first appearance with ``now`` (a
    statement-wide value) first when the statement takes it; and the names in number order.
    Binding a row's values by position is cheaper than by name (``store.sqlite.positional``).
    Whole-line comments go first: their ``:words`` are no parameters."""
    sql = _code(sql)
    names = [m.group(1) for m in _BIND.finditer(sql)]
    order = tuple(dict.fromkeys((["now"] if "now" in names else []) + names))
    number = {name: f"?{position}" for position, name in enumerate(order, start=1)}
    return _BIND.sub(lambda m: number[m.group(1)], sql), order


@cache
def _raw_queries(dialect: str) -> dict[str, str]:
    text = resources.files("taskward.store").joinpath(dialect, "queries.sql").read_text("utf-8")
    return parse_queries(text)


def _code(sql: str) -> str:
    """``sql`` without its whole-line comments and indentation (no statement in queries.sql
    has a multi-line string literal). psycopg caches its parse of a statement only up to 4,096
    bytes and parsed a longer one again on every execution; the comments, which the server
    never needs, were most of the length (and their ``:name`` words became placeholders)."""
    return "\n".join(
        stripped
        for stripped in (line.strip() for line in sql.splitlines())
        if stripped and not stripped.startswith("--")
    )


@cache
def load_queries(dialect: str) -> dict[str, str]:
    """``{name: sql}``; on PostgreSQL in psycopg's placeholders, without comments."""
    queries = _raw_queries(dialect)
    if dialect == "postgres":
        return {
            name: to_pyformat(_code(sql)).replace("%(now)s", _PG_NOW)
            for name, sql in queries.items()
        }
    return queries


_ARRAY_BIND = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)::(\w+)\[\]")


@cache
def many_columns(name: str) -> tuple[tuple[str, str], ...]:
    """A PostgreSQL set-based write's array parameters in order: (name, element type), read
    from its ``:name::type[]`` casts. ``Tx.write_many`` sends column ``name`` of its rows as
    the array ``name``."""
    sql = _raw_queries("postgres")[name]
    if "_many" not in name:  # <name>_many, run_insert_many_if_new
        raise KeyError(f"{name!r} is not a set-based write")
    columns = tuple((m.group(1), m.group(2)) for m in _ARRAY_BIND.finditer(sql))
    if not columns:
        raise ValueError(f"{name!r} takes no array parameters")
    return columns

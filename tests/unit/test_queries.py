"""Both dialects define the same named queries; the query-file parser is strict."""

from __future__ import annotations

import pytest

from taskward.store.migrate import load_migrations
from taskward.store.queries import load_queries, parse_queries, to_pyformat


def test_both_dialects_define_the_same_query_names() -> None:
    assert set(load_queries("sqlite")) == set(load_queries("postgres"))


def test_parser_splits_named_blocks_and_rejects_duplicates() -> None:
    text = "-- header\n-- name: a\nSELECT 1;\n-- name: b\n-- doc\nSELECT 2;\n"
    assert parse_queries(text) == {"a": "SELECT 1;", "b": "-- doc\nSELECT 2;"}
    with pytest.raises(ValueError, match="twice"):
        parse_queries("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;")


def test_pyformat_rewrites_binds_and_keeps_casts() -> None:
    assert to_pyformat("SELECT :a::jsonb, x::text, '%'") == "SELECT %(a)s::jsonb, x::text, '%%'"


def test_migrations_are_gap_free_and_numbered_alike() -> None:
    sqlite = [(m.version, m.name) for m in load_migrations("sqlite")]
    postgres = [(m.version, m.name) for m in load_migrations("postgres")]
    assert sqlite == postgres
    assert [v for v, _ in sqlite] == list(range(1, len(sqlite) + 1))

"""Both dialects define the same named queries; the query-file parser is strict."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from taskward.store.migrate import load_migrations
from taskward.store.queries import load_queries, parse_queries, to_positional, to_pyformat

# Statements only PostgreSQL has: its one-statement claim pass and finish (data-modifying CTEs,
# which SQLite lacks), PostgreSQL's form of the one claim and the one finish, sent only by
# ``transitions`` (tests/unit/test_one_writer.py). Kept because they were measured to pay:
# without them a PostgreSQL drain runs at 0.80 and 0.87 of the tasks a second
# (docs/benchmarks.md "Do the PostgreSQL one-statement paths pay?").
POSTGRES_ONLY = {"run_claim_batch", "run_finish_batch"}


def test_both_dialects_define_the_same_query_names() -> None:
    assert set(load_queries("sqlite")) == set(load_queries("postgres")) - POSTGRES_ONLY


def test_parser_splits_named_blocks_and_rejects_duplicates() -> None:
    text = "-- header\n-- name: a\nSELECT 1;\n-- name: b\n-- doc\nSELECT 2;\n"
    assert parse_queries(text) == {"a": "SELECT 1;", "b": "-- doc\nSELECT 2;"}
    with pytest.raises(ValueError, match="twice"):
        parse_queries("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;")


def test_pyformat_rewrites_binds_and_keeps_casts() -> None:
    assert to_pyformat("SELECT :a::jsonb, x::text, '%'") == "SELECT %(a)s::jsonb, x::text, '%%'"


def test_positional_numbers_binds_with_now_first_and_skips_comments() -> None:
    text, names = to_positional("-- uses :ignored\nSELECT :b, :now, :a, :b, ':' || :a")
    assert text == "SELECT ?2, ?1, ?3, ?2, ':' || ?3"
    assert names == ("now", "b", "a")
    assert to_positional("SELECT :x") == ("SELECT ?1", ("x",))


@pytest.mark.parametrize("name", sorted(load_queries("sqlite")))
def test_every_sqlite_statement_reads_the_same_by_position(name: str) -> None:
    """Put each ``?N`` back as the N-th name: the statement is its named self, comments aside
    (SQLite's set-based writes bind by position, store.sqlite.positional)."""
    text, names = to_positional(load_queries("sqlite")[name])
    named = re.sub(r"\?(\d+)", lambda m: ":" + names[int(m.group(1)) - 1], text)
    code = "\n".join(
        line.strip()
        for line in load_queries("sqlite")[name].splitlines()
        if line.strip() and not line.strip().startswith("--")
    )
    assert named == code
    assert ("now" in names) == (names[:1] == ("now",))


def test_migrations_are_gap_free_and_numbered_alike() -> None:
    sqlite = [(m.version, m.name) for m in load_migrations("sqlite")]
    postgres = [(m.version, m.name) for m in load_migrations("postgres")]
    assert sqlite == postgres
    assert [v for v, _ in sqlite] == list(range(1, len(sqlite) + 1))


def test_each_set_based_write_takes_one_array_per_parameter_of_its_one_row_statement() -> None:
    """PostgreSQL's ``<name>_many`` statements take a binary array per column; the columns
    are exactly the one-row statement's parameters, which SQLite's executemany binds."""
    import re

    from taskward.store.queries import many_columns

    sqlite = load_queries("sqlite")
    one_row = {
        "fact_insert_many": "fact_insert",
        "event_insert_many": "event_insert",
        "outbox_enqueue_many": "outbox_enqueue",
        "summary_write_many": "summary_write",
        "summary_insert_many": "summary_write",
        "run_insert_many_if_new": "run_insert_if_new",
        # SQLite's is itself the one-row statement (R20's claim log has no single-row caller)
        "limit_claim_insert_many": "limit_claim_insert_many",
        # R21's links: SQLite's is itself the one-row statement (admission writes them as a set)
        "task_dependency_insert_many": "task_dependency_insert_many",
        # R22's results are written only with their completions' facts: no single-row caller
        "result_insert_many": "result_insert_many",
        # R23's archive writes its documents a batch at a time: no single-row caller
        "archived_run_insert_many": "archived_run_insert_many",
    }
    postgres = load_queries("postgres")
    assert {n for n in postgres if "_many" in n} == set(one_row)
    for many, single in one_row.items():
        columns = {name for name, _ in many_columns(many)}
        single_params = set(re.findall(r"(?<![:\w]):([A-Za-z_]\w*)", sqlite[single])) - {"now"}
        assert columns == single_params, many
        assert all(f"%({name})s::" in postgres[many] for name in columns)
    with pytest.raises(KeyError):
        many_columns("fact_insert")


def test_the_widest_compare_and_swap_stays_within_psycopgs_parse_cache() -> None:
    """psycopg caches the parse of a statement of at most 4,096 bytes only; beyond it a
    compare-and-swap would be parsed again on every execution. The widest shape: every patch
    column set, every guard compared."""
    from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH, MAX_CACHED_STATEMENT_PARAMS

    from taskward.store.guarded import build_run_update_many
    from taskward.store.port import RUN_GUARD_COLUMNS, RUN_PATCH_COLUMNS

    values = {
        "status": "completed",
        "updated_at": 1.0,
        "status_reason_code": "ok",
        "status_reason_summary": "",
        "status_evidence_refs": "[]",
        **{column: None for column in sorted(RUN_PATCH_COLUMNS)},
    }
    guard = {column: 1.0 for column in sorted(RUN_GUARD_COLUMNS)} | {"leased_by": "w"}
    items = [(f"r{n}", "running", values, guard) for n in range(2)]
    sql, params = build_run_update_many(items, ("*",), dialect="postgresql")
    assert len(to_pyformat(sql).encode()) <= MAX_CACHED_STATEMENT_LENGTH
    assert len(params) <= MAX_CACHED_STATEMENT_PARAMS


def test_every_postgres_statement_stays_within_psycopgs_parse_cache() -> None:
    """Named statements travel without their comments (the server never needs them): with
    them, the one-statement claim pass was 5,806 bytes and psycopg parsed it again on every
    execution. Comments are gone, code is kept, and every statement fits the cache."""
    from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH

    raw = parse_queries(
        resources.files("taskward.store").joinpath("postgres", "queries.sql").read_text("utf-8")
    )
    loaded = load_queries("postgres")
    assert loaded.keys() == raw.keys()
    for name, sql in loaded.items():
        assert len(sql.encode()) <= MAX_CACHED_STATEMENT_LENGTH, name
        assert not any(line.startswith("--") for line in sql.splitlines()), name
        code = [ln.strip() for ln in raw[name].splitlines()]
        assert len(sql.splitlines()) == len([ln for ln in code if ln and not ln.startswith("--")])


def _task_filter(sql: str) -> str:
    """The dashboard task filter of a statement: from ``(:status`` through the search's last
    field, whitespace folded."""
    start = sql.index("(:status")
    end = sql.index("r.status_reason_summary, '')), :q) > 0)", start)
    return " ".join(sql[start:end].split())


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
def test_the_dashboards_task_filter_is_the_same_in_its_three_statements(dialect: str) -> None:
    """The list, its previous page and its count each spell the filter out (one statement a
    direction keeps each on its index): they must filter alike, or a page and its total
    disagree. Change all three together."""
    text = resources.files("taskward.store").joinpath(dialect, "queries.sql").read_text("utf-8")
    queries = parse_queries(text)  # as written (load_queries rewrites PostgreSQL's binds)
    filters = {
        name: _task_filter(queries[name])
        for name in ("dash_task_list", "dash_task_list_newer", "dash_task_count")
    }
    assert len(set(filters.values())) == 1, filters
    assert "action_args" in filters["dash_task_count"]  # the search reaches the args

"""PostgreSQL's one-statement paths turned off one at a time, for A/B pairs of the same tree.

A measurement wrapper (issue 24, item 2: "if a PostgreSQL one-statement path does not clearly
pay, delete it"). It monkeypatches the functions that choose a fast path, then runs
``bench/inprocess.py`` (``drain``) or ``bench/instructions.py`` (``instructions``) unchanged;
nothing under ``src/`` is edited. The configurations (``CONFIGS``):

- ``default``: every fast path on (what taskward does).
- ``noclaim``: no one-statement claim pass (``run_claim_batch``):
  ``transitions.claim.claim_first_page`` answers None, and the paged pass writes its claims
  through ``transitions.apply`` (a set-based compare-and-swap, then the facts and events with
  ``write_many``), as on SQLite. The pipelined step keeps the summaries and the finish in one
  round trip; its claims follow as paged passes.
- ``nofinish``: no one-statement finish (``run_finish_batch``): a group of terminal builds
  declines its template and goes a request per item through ``transitions.apply``, and the
  pipelined step is off (it needs the finish statement): summaries, finish and claim passes as
  separate statements in one transaction.
- ``finishwritten``: no one-statement finish, and the group of terminal builds written from
  the finish template as SQLite writes it (``transitions.finish.finish_moves`` through
  ``apply``); the pipelined step off as in ``nofinish``; claims unchanged (one statement).
- ``notogether``: no pipelined step (``transitions.finish.together`` sends the summaries, the
  one-statement finish and the one-statement claim passes one after the other).
- ``generic``: ``_PgTx.auditing()`` answers None: no one-statement form at all, exactly
  SQLite's path (``transitions.apply`` for everything).

``--count-statements`` also counts, from the drain's start to its last completion, every
statement the worker sends (``psycopg.AsyncConnection.execute`` calls, by queries.sql name) and
its round trips (a call outside a pipeline is one, a pipeline is one); the counting costs CPU,
so time without it. Usage::

    .venv/bin/python bench/paths.py drain generic --backend postgres          # inprocess.py's args
    .venv/bin/python bench/paths.py drain nofinish --count-statements --count 2000
    .venv/bin/python bench/paths.py instructions generic --backend postgres --layers drain

``drain`` prints inprocess.py's JSON line with ``paths`` (and the counts) added; ``instructions``
runs instructions.py's children with the configuration applied (a ``sitecustomize`` on their
``PYTHONPATH`` calls ``apply``), its output unchanged.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(1, str(ROOT))  # bench.*, after PYTHONPATH (the taskward measured comes first)

ENV = "TASKWARD_BENCH_PATHS"


class _Unaudited:
    """A transaction that says it writes no audit rows in its statements (``auditing()`` is
    None); everything else is the wrapped transaction's."""

    def __init__(self, tx: Any) -> None:
        self._tx = tx

    def auditing(self) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tx, name)


async def _declined(*args: Any, **kwargs: Any) -> None:
    return None  # "not run here": the caller takes the general path


def _no_claim_statement() -> None:
    from taskward.claims import passes
    from taskward.host import source

    passes.claim_first_page = _declined  # type: ignore[assignment]  # claim_pass's, by name
    # The pipelined step with no claim statements: summaries and finish together (no
    # passes), then paged passes for every freed slot.
    source.pass_calls = lambda spec, wanted, now: []  # type: ignore[assignment]


def _no_finish_statement() -> None:
    from taskward.transitions import finish

    finish.apply_finishes = _declined  # type: ignore[assignment]  # a request per item
    finish.finish_call = lambda tx, builds: None  # type: ignore[assignment]


def _finish_written() -> None:
    from taskward.transitions import finish

    finishes = finish.apply_finishes

    async def written(tx: Any, *args: Any, **kwargs: Any) -> Any:
        return await finishes(_Unaudited(tx), *args, **kwargs)

    finish.apply_finishes = written  # type: ignore[assignment]
    finish.finish_call = lambda tx, builds: None  # type: ignore[assignment]


def _no_together() -> None:
    from taskward.host import source
    from taskward.transitions import finish
    from taskward.transitions.claim import claim_first_page

    async def apart(tx: Any, writes: Any, builds: Any, passes: Any) -> Any:
        counts = await tx.write_many(writes)
        results = await finish.apply_built(tx, builds)
        answers = [await claim_first_page(tx, t, p, limit=n) for t, p, n in passes]
        return counts, results, answers

    source.together = apart  # type: ignore[assignment]  # imported by name


def _generic() -> None:
    from taskward.store.postgres.db import _PgTx

    _PgTx.auditing = lambda self: None  # type: ignore[assignment,method-assign,return-value]


CONFIGS: dict[str, Callable[[], None]] = {
    "default": lambda: None,
    "noclaim": _no_claim_statement,
    "nofinish": _no_finish_statement,
    "finishwritten": _finish_written,
    "notogether": _no_together,
    "generic": _generic,
}


def apply(config: str) -> None:
    if config not in CONFIGS:
        raise SystemExit(f"unknown configuration {config!r}; allowed: {', '.join(CONFIGS)}")
    CONFIGS[config]()


# -- counting statements and round trips ------------------------------------------------------


class Counts:
    def __init__(self) -> None:
        self.on = False
        self.statements: Counter[str] = Counter()
        self.round_trips = 0
        self.seconds: dict[str, float] = {}  # lone statements' wall time, by name

    def snapshot(self) -> tuple[Counter[str], int]:
        return Counter(self.statements), self.round_trips


def _namer() -> Callable[[Any], str]:
    from taskward.store.queries import load_queries

    names: dict[str, str] = {}
    for name, sql in load_queries("postgres").items():
        names[sql.decode() if isinstance(sql, bytes) else str(sql)] = name

    def name_of(query: Any) -> str:
        text = query.decode() if isinstance(query, bytes) else str(query)
        if text in names:
            return names[text]
        head = text.lstrip().split(None, 1)[0].upper() if text.strip() else "?"
        if head == "BEGIN":
            return "BEGIN" + ("+clock" if "SELECT" in text else "")
        if head in ("COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE", "SELECT", "LISTEN"):
            return head
        if "run_update_many" in text or "UPDATE schedule_runs" in text:
            return "run_update (built)"
        return " ".join(text.split()[:3])

    return name_of


def count_statements(counts: Counts) -> None:
    """Wrap psycopg's ``AsyncConnection.execute`` and ``pipeline`` to count what is sent."""
    import psycopg

    name_of = _namer()
    execute = psycopg.AsyncConnection.execute
    pipeline = psycopg.AsyncConnection.pipeline

    async def counted_execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        if not counts.on:
            return await execute(self, query, *args, **kwargs)
        name = name_of(query)
        counts.statements[name] += 1
        if self._pipeline is not None:
            return await execute(self, query, *args, **kwargs)
        counts.round_trips += 1
        start = time.perf_counter()
        try:
            return await execute(self, query, *args, **kwargs)
        finally:  # a lone statement's wait, round trip included (a pipeline's is not split)
            counts.seconds[name] = counts.seconds.get(name, 0.0) + time.perf_counter() - start

    @contextlib.asynccontextmanager
    async def counted_pipeline(self: Any) -> AsyncIterator[Any]:
        outer = self._pipeline is None
        async with pipeline(self) as p:
            yield p
        if counts.on and outer:
            counts.round_trips += 1

    psycopg.AsyncConnection.execute = counted_execute  # type: ignore[method-assign]
    psycopg.AsyncConnection.pipeline = counted_pipeline  # type: ignore[method-assign]


def run_drain(config: str, argv: list[str]) -> int:
    counting = "--count-statements" in argv
    argv = [arg for arg in argv if arg != "--count-statements"]
    apply(config)
    from bench import inprocess

    counts = Counts()
    measured: dict[str, Any] = {}
    if counting:
        count_statements(counts)
        drain_noops = inprocess.drain_noops

        async def counted_drain(*args: Any, started: Any = None, finished: Any = None) -> Any:
            def on_start(runtime: Any) -> None:
                counts.on = True
                if started is not None:
                    started(runtime)

            def on_finish(runtime: Any) -> None:
                if finished is not None:
                    finished(runtime)
                counts.on = False
                measured["statements"], measured["round_trips"] = counts.snapshot()

            return await drain_noops(*args, started=on_start, finished=on_finish)

        inprocess.drain_noops = counted_drain  # type: ignore[assignment]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = inprocess.main(argv)
    result = json.loads(out.getvalue().strip().splitlines()[-1])
    result["paths"] = config
    if measured:
        n = next((int(argv[i + 1]) for i, arg in enumerate(argv[:-1]) if arg == "--count"), 10_000)
        statements: Counter[str] = measured["statements"]
        result["statements_per_task"] = round(sum(statements.values()) / n, 3)
        result["round_trips_per_task"] = round(measured["round_trips"] / n, 3)
        result["by_statement_per_task"] = {
            name: round(calls / n, 3) for name, calls in statements.most_common()
        }
        result["lone_statement_ms_per_call"] = {
            name: round(seconds / statements[name] * 1e3, 3)
            for name, seconds in sorted(counts.seconds.items(), key=lambda kv: -kv[1])
        }
    print(json.dumps(result))
    return status


def run_instructions(config: str, argv: list[str]) -> int:
    apply(config)  # checks the name; the parent itself drains nothing
    with tempfile.TemporaryDirectory(prefix="tw-paths-") as site:
        (Path(site) / "sitecustomize.py").write_text(
            "import os\n"
            "if os.environ.get('TASKWARD_BENCH_PATHS'):\n"
            "    import bench.paths\n"
            "    bench.paths.apply(os.environ['TASKWARD_BENCH_PATHS'])\n"
            "    if os.environ.get('TASKWARD_BENCH_PATHS_LOG'):\n"
            "        with open(os.environ['TASKWARD_BENCH_PATHS_LOG'], 'a') as log:\n"
            "            log.write(os.environ['TASKWARD_BENCH_PATHS'] + ' applied\\n')\n"
        )
        path = [site, os.environ.get("PYTHONPATH", ""), str(ROOT)]
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
        os.environ[ENV] = config
        from bench import instructions

        return instructions.main(argv)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or args[0] not in ("drain", "instructions"):
        print(__doc__, file=sys.stderr)
        return 2
    mode, config, rest = args[0], args[1], args[2:]
    return run_drain(config, rest) if mode == "drain" else run_instructions(config, rest)


if __name__ == "__main__":
    sys.exit(main())

"""One writer of status, in fact (ADR-0072 D3; issue 24 item 1): ``transitions/`` is the only
code that changes a run's status or records a transition.

Read off the source, not the running code, so a second path fails here the moment it is
written: no module outside ``transitions/`` (and the store that implements the port) calls a
guarded update, asks the store for its one-statement forms, or names a statement that writes a
fact; and in both dialects' queries.sql only the transition statements set a run's status or
insert a fact.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from taskward.store.queries import load_queries

SRC = Path(__file__).resolve().parents[2] / "src" / "taskward"

# The port's writes of status (Tx.run_update_if, Tx.run_update_many) and its one-statement
# forms (Tx.auditing -> AuditingTx.claim_queued / finish_running / together).
GUARDED_CALLS = frozenset(
    {"run_update_if", "run_update_many", "auditing", "claim_queued", "finish_running", "together"}
)
# Named statements that write a fact (or a run's status with it).
TRANSITION_STATEMENTS = frozenset(
    {"fact_insert", "fact_insert_many", "run_claim_batch", "run_finish_batch"}
)
# checker's probe inserts a fact inside a transaction it always rolls back, to prove that the
# store refuses UPDATE and DELETE of facts (append-only); it changes no run.
PROBES = frozenset({"check_fact_probe_insert"})


def _modules_outside_the_writer() -> list[Path]:
    paths = []
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC).parts
        if parts[0] in {"transitions", "store"}:
            continue
        paths.append(path)
    assert len(paths) > 50  # the package is there and the walk found it
    return paths


@pytest.mark.parametrize(
    "path", _modules_outside_the_writer(), ids=lambda p: str(p.relative_to(SRC))
)
def test_no_module_outside_transitions_writes_a_status(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    calls = sorted(
        node.func.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in GUARDED_CALLS
    )
    named = sorted(
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in TRANSITION_STATEMENTS
    )
    assert calls == [], f"{path.name} calls the store's guarded writes: use taskward.transitions"
    assert named == [], f"{path.name} names a transition statement: use taskward.transitions"


def test_the_grep_would_catch_a_second_writer() -> None:
    """The check above on a module that does what it forbids (so it cannot pass vacuously)."""
    source = 'async def f(tx):\n    await tx.run_update_if("r", "queued", {}, {})\n'
    tree = ast.parse(source)
    found = [
        node.func.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
    ]
    assert "run_update_if" in found and set(found) & GUARDED_CALLS


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
def test_only_transition_statements_set_a_status_or_insert_a_fact(dialect: str) -> None:
    for name, sql in load_queries(dialect).items():
        text = sql if isinstance(sql, str) else sql.decode()
        for update in re.finditer(
            r"UPDATE\s+schedule_runs\s+SET\s+(.*?)\s+(?:WHERE|FROM|RETURNING)", text, re.I | re.S
        ):
            columns = {c.split("=")[0].strip() for c in update.group(1).split(",")}
            if "status" in columns:
                assert name in TRANSITION_STATEMENTS, f"{dialect} {name} sets a run's status"
        if re.search(r"INSERT\s+INTO\s+status_transitions", text, re.I):
            assert name in TRANSITION_STATEMENTS | PROBES, f"{dialect} {name} inserts a fact"

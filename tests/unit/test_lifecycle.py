"""The lifecycle graph is data: exactly R2's 14 edges, terminal states have no exits."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from taskward.errors import InvalidTransition
from taskward.lifecycle import EDGES, REASON_CODES, TERMINAL, Status, check_edge, check_reason_code

R2_EDGES = {
    ("queued", "running"),
    ("queued", "waiting_dependency"),
    ("queued", "skipped"),
    ("queued", "cancelled"),
    ("waiting_dependency", "queued"),
    ("waiting_dependency", "skipped"),
    ("waiting_dependency", "cancelled"),
    ("running", "completed"),
    ("running", "failed"),
    ("running", "timed_out"),
    ("running", "retry_wait"),
    ("running", "cancelled"),
    ("retry_wait", "queued"),
    ("retry_wait", "cancelled"),
}


def test_graph_has_exactly_the_fourteen_declared_edges() -> None:
    declared = {(src.value, dst.value) for src, outs in EDGES.items() for dst in outs}
    assert declared == R2_EDGES
    assert len(declared) == 14


def test_terminal_states_are_the_five_without_exits() -> None:
    assert {s.value for s in TERMINAL} == {
        "completed",
        "failed",
        "timed_out",
        "skipped",
        "cancelled",
    }


@pytest.mark.parametrize("src,dst", sorted(itertools.product([s.value for s in Status], repeat=2)))
def test_every_pair_is_accepted_exactly_when_declared(src: str, dst: str) -> None:
    if (src, dst) in R2_EDGES:
        check_edge(src, dst)
    else:
        with pytest.raises(InvalidTransition) as info:
            check_edge(src, dst)
        assert isinstance(info.value, ValueError)
        assert info.value.field == "to_state"


def test_running_to_queued_is_not_an_edge() -> None:
    with pytest.raises(InvalidTransition, match="running -> queued"):
        check_edge("running", "queued")


def test_unknown_state_names_the_field_and_the_nine_states() -> None:
    with pytest.raises(InvalidTransition) as info:
        check_edge("leased", "running")
    assert info.value.field == "from_state"
    assert "retry_wait" in info.value.allowed


def test_unknown_reason_code_is_rejected() -> None:
    with pytest.raises(InvalidTransition) as info:
        check_reason_code("because")
    assert info.value.field == "reason.code"
    assert "lease_expired" in info.value.allowed
    assert "lease_expired" in REASON_CODES


def test_docs_lifecycle_diagram_matches_edges() -> None:
    doc = Path(__file__).parents[2] / "docs" / "lifecycle.md"
    edges = set(re.findall(r"^\s*(\w+)\s*-->\s*(\w+)", doc.read_text(), flags=re.M))
    assert edges == R2_EDGES

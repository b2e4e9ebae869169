from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskward.canonical import canonical_json, content_hash, dumps, plain_canonical_json
from taskward.host.models import SessionSummary
from taskward.host.summaries import summary_json
from taskward.models import Actor, StateReason, TransitionRequest
from taskward.transitions import request_hash
from taskward.transitions.apply import applied_move
from taskward.transitions.rows import audit_rows, move_of


def test_canonical_json_sorts_keys_and_is_compact_utf8() -> None:
    assert canonical_json({"b": 1, "a": ["é", None]}) == '{"a":["é",null],"b":1}'


def test_nan_is_refused() -> None:
    with pytest.raises(ValueError):
        canonical_json({"x": math.nan})


def test_hash_is_sha256_prefixed_lowercase_hex_and_order_independent() -> None:
    h = content_hash({"a": 1, "b": 2})
    assert h == content_hash({"b": 2, "a": 1})
    assert h.startswith("sha256:") and len(h) == 7 + 64 and h[7:] == h[7:].lower()


# -- request_hash: the spliced canonical text equals the model's --------------------------------

_json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(),
    st.datetimes(),  # not plain JSON: must take the model's path
    st.tuples(st.integers()),
)
_json_values = st.recursive(
    _json_leaf,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.one_of(st.text(), st.integers()), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(
    entity_id=st.text(min_size=1),
    key=st.text(min_size=1),
    code=st.text(),
    summary=st.text(),
    actor_id=st.text(min_size=1),
    evidence=st.lists(st.dictionaries(st.text(), _json_values, max_size=3), max_size=3),
    metadata=st.dictionaries(st.text(), _json_values, max_size=3),
)
def test_request_hash_equals_the_hash_of_the_models_json(
    entity_id: str,
    key: str,
    code: str,
    summary: str,
    actor_id: str,
    evidence: list[dict[str, Any]],
    metadata: dict[str, Any],
) -> None:
    request = TransitionRequest(
        entity_id=entity_id,
        from_state="running",
        to_state="completed",
        reason=StateReason(code=code, summary=summary, evidence_refs=evidence, metadata=metadata),
        actor=Actor(type="agent", id=actor_id),
        idempotency_key=key,
    )
    try:
        expected = content_hash(request.model_dump(mode="json"))
    except (TypeError, ValueError):  # the model's JSON itself is not canonical JSON
        with pytest.raises((TypeError, ValueError)):
            request_hash(request)
        return
    assert request_hash(request) == expected


def test_request_hash_of_the_hot_paths_requests() -> None:
    """The claim's and the completion's shapes (plain evidence, empty metadata) take the
    spliced path and agree with the model's hash, non-ASCII and escapes included."""
    request = TransitionRequest(
        entity_id="r-é\n1",
        from_state="queued",
        to_state="running",
        reason=StateReason(
            code="claimed",
            summary='attempt "1" \u2028',
            evidence_refs=[{"kind": "summary", "session_key": "t:1", "n": 1.5, "ok": True}],
        ),
        actor=Actor(type="agent", id="worker-1"),
        idempotency_key="claim:w:1",
    )
    assert request_hash(request) == content_hash(request.model_dump(mode="json"))
    assert plain_canonical_json(request.reason.evidence_refs) is not None


def test_transition_event_payload_is_the_compact_json_of_its_fields() -> None:
    request = TransitionRequest(
        entity_id="r1",
        from_state="running",
        to_state="failed",
        reason=StateReason(code='adapter "x" é', summary="s"),
        actor=Actor(type="operator", id="ops\u2028\\"),
        idempotency_key="k",
    )
    move = move_of(request, {}, {}, "sha256:0", 1.0)
    _, event, notification = audit_rows(move, "t1", "e1", None)
    assert notification is not None  # failed is terminal: its notification, beside the event
    assert event["payload"] == dumps(
        {
            "from": "running",
            "to": "failed",
            "reason_code": 'adapter "x" é',
            "actor": "operator:ops\u2028\\",
        }
    )
    assert json.loads(event["payload"])["actor"] == "operator:ops\u2028\\"


def _assert_summary_json_is_the_models(
    facts: dict[str, Any], narrative: str | None, manifest_ref: str
) -> None:
    """``summary_json`` is the canonical JSON of the model's dump, or raises as encoding it
    does."""
    summary = SessionSummary(facts=facts, narrative=narrative, manifest_ref=manifest_ref)
    try:
        expected = canonical_json(summary.model_dump(mode="json"))
    except (TypeError, ValueError):
        with pytest.raises((TypeError, ValueError)):
            summary_json(summary)
        return
    assert summary_json(summary) == expected


@settings(max_examples=200, deadline=None)
@given(
    facts=st.dictionaries(st.text(), _json_values, max_size=5),
    narrative=st.one_of(st.none(), st.text()),
    manifest_ref=st.text(),
)
def test_summary_json_equals_the_canonical_json_of_the_models_dump(
    facts: dict[str, Any], narrative: str | None, manifest_ref: str
) -> None:
    _assert_summary_json_is_the_models(facts, narrative, manifest_ref)


def test_summary_json_of_the_hosts_own_summary_is_spliced_and_equal() -> None:
    facts = {
        "task_id": "t-é",
        "attempt": 1,
        "elapsed_ms": 0.125,
        "operation_statuses": {},
        "artifact_refs": [],
        "usage": {"tokens": 3},
        "degraded": False,
        "degrade_reason": "",
    }
    summary = SessionSummary(facts=facts, narrative=None, manifest_ref="manifest:t")
    assert plain_canonical_json(facts) is not None
    assert summary_json(summary) == canonical_json(summary.model_dump(mode="json"))


_host_values = st.one_of(
    st.text(), st.integers(), st.floats(), st.booleans(), st.none(), st.lists(st.text())
)


@settings(max_examples=300, deadline=None)
@given(
    values=st.fixed_dictionaries(
        {
            "task_id": st.one_of(st.text(), _host_values),
            "attempt": st.one_of(st.integers(min_value=1), _host_values),
            "run_id": st.text(),
            "started_at": st.text(),
            "ended_at": st.one_of(st.text(), _host_values),
            "elapsed_ms": st.one_of(st.floats(allow_nan=True), _host_values),
            "operation_statuses": st.dictionaries(st.text(), st.text(), max_size=3),
            "artifact_refs": st.lists(st.dictionaries(st.text(), _json_values, max_size=2)),
            "usage": st.dictionaries(st.text(), _json_values, max_size=3),
            "degraded": st.one_of(st.booleans(), _host_values),
            "degrade_reason": st.text(),
        }
    ),
    narrative=st.one_of(st.none(), st.text()),
    manifest_ref=st.text(),
)
def test_the_hosts_facts_spliced_equal_the_models_canonical_json(
    values: dict[str, Any], narrative: str | None, manifest_ref: str
) -> None:
    """The host's own facts (host.job's _summary: these keys, usually these types) are
    spliced key by key; any value of another type, or a non-finite float, takes the generic
    path. Either way the text is the model's canonical JSON, or the same error."""
    from taskward.host.summaries import HOST_FACT_KEYS

    assert sorted(values) == list(HOST_FACT_KEYS)
    _assert_summary_json_is_the_models(values, narrative, manifest_ref)


def test_an_applied_result_is_the_model_its_fields_make() -> None:
    """``transitions.apply.applied_move`` builds its TransitionResult without pydantic's
    per-field loop (``models.constructed``): the same instance as the validated model and as
    ``model_construct``, down to the fields it says were set."""
    from taskward.models import TransitionResult

    request = TransitionRequest(
        entity_id="r1",
        from_state="running",
        to_state="completed",
        reason=StateReason(code="completed"),
        actor=Actor(type="system", id="w"),
        idempotency_key="ack:w/1",
    )
    fast = applied_move(request.from_state, request.to_state, "t1", "e1")
    given = {
        "applied": True,
        "previous_state": "running",
        "current_state": "completed",
        "transition_id": "t1",
        "event_id": "e1",
    }
    assert type(fast) is TransitionResult
    assert fast == TransitionResult(**given) == TransitionResult.model_construct(**given)
    assert fast.model_dump() == TransitionResult(**given).model_dump()
    assert fast.model_fields_set == TransitionResult.model_construct(**given).model_fields_set


@pytest.mark.parametrize("text", ["{}", "[]", b"{}", b"[]", '{"a":[]}', "[1]", " {}", "null"])
def test_loads_reads_every_document_as_json_does_and_the_empty_ones_fresh(
    text: str | bytes,
) -> None:
    from taskward.canonical import loads

    assert loads(text) == json.loads(text)
    first, second = loads(text), loads(text)
    if isinstance(first, dict | list):
        first.append(1) if isinstance(first, list) else first.update(x=1)
        assert second == json.loads(text)  # never a shared empty value
    assert loads(None) is None

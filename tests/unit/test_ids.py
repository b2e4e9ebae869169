"""Row ids are RFC 9562 version-7 UUIDs: valid, unique, and ordered by their millisecond."""

from __future__ import annotations

import time
import uuid

from taskward.ids import new_id


def test_ids_are_version_7_rfc_uuids_carrying_the_current_millisecond() -> None:
    before = time.time_ns() // 1_000_000
    text = new_id()
    value = uuid.UUID(text)
    after = time.time_ns() // 1_000_000
    assert str(value) == text  # exactly uuid's canonical text form
    assert value.version == 7
    assert value.variant == uuid.RFC_4122
    assert before <= value.int >> 80 <= after
    assert str(value) == str(value).lower() and len(str(value)) == 36


def test_ids_are_unique_and_sort_by_time_across_milliseconds() -> None:
    ids = [new_id() for _ in range(5000)]
    assert len(set(ids)) == len(ids)
    first = new_id()
    deadline = time.monotonic() + 1.0
    while uuid.UUID(new_id()).int >> 80 == uuid.UUID(first).int >> 80:
        assert time.monotonic() < deadline
    later = new_id()
    assert first < later  # string order is time order across milliseconds

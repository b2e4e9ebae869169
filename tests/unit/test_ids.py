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


def test_every_random_bit_of_an_id_varies() -> None:
    """74 random bits: an id's random part (after the version digit) takes both values of
    each of them over a few thousand ids, the variant's two random bits included."""
    values = [uuid.UUID(new_id()).int for _ in range(4000)]
    random_mask = (1 << 74) - 1
    packed = [(v & ((1 << 62) - 1)) | ((v >> 64) & 0xFFF) << 62 for v in values]
    seen_set = 0
    seen_clear = 0
    for v in packed:
        seen_set |= v
        seen_clear |= ~v & random_mask
    assert seen_set == random_mask and seen_clear == random_mask
    assert {f"{v:032x}"[16] for v in values} == set("89ab")


def test_a_forked_child_never_repeats_its_parents_random_bytes() -> None:
    """Ids draw random bytes from a buffer: a fork must not hand the child the parent's."""
    import os

    new_id()  # the parent's buffer now holds unused bytes
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, then out without running the test session's exit
        os.close(read_end)
        os.write(write_end, " ".join(new_id() for _ in range(50)).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        child = pipe.read().split()
    os.waitpid(pid, 0)
    parent = [new_id() for _ in range(50)]
    assert len(child) == 50
    assert not {c[14:] for c in child} & {p[14:] for p in parent}  # the random digits

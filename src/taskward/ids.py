"""Ids of stored rows: time-ordered UUIDs (RFC 9562 version 7).

Every run, fact, event, notification and schedule row gets one. The first 48 bits are the Unix
time in milliseconds, so ids made close together sort close together: new rows land on the same
few index pages instead of a random page each; random (version 4) ids made a deep store write
many more pages a task (measured: docs/benchmarks.md#figures-that-justified-design-choices).
Nothing reads order or time out of an id; callers still treat ids as opaque strings. Random
tokens that are not row ids (generated idempotency keys, worker ids) stay version 4.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterator

_VARIANT = "89ab"  # the hex digit that opens the variant group: 0b10 then two random bits

# Random bytes drawn from the kernel RANDOM_IDS ids at a time, not one system call per id.
# Thread-safe without a lock under the GIL: each buffer comes with its own counter, and next()
# on it hands every caller a different slice; a caller that finds the buffer used up installs a
# new pair (two callers racing there install two, each fresh) and takes its own ten bytes
# directly. A forked child draws a buffer of its own at once, so parent and child never share
# bytes (os.register_at_fork below).
RANDOM_IDS = 400
_pool: tuple[bytes, Iterator[int]]


def _fresh_pool() -> None:
    global _pool
    _pool = (os.urandom(10 * RANDOM_IDS), itertools.count())


_fresh_pool()


def _random10() -> bytes:
    buffer, counter = _pool
    i = next(counter)
    if i < RANDOM_IDS:
        return buffer[i * 10 : i * 10 + 10]
    _fresh_pool()
    return os.urandom(10)


os.register_at_fork(after_in_child=_fresh_pool)


def new_id() -> str:
    """A new version-7 UUID string: 48 bits of milliseconds, then 74 random bits.

    Built as text from the random bytes' hex form (uuid.UUID's own text form, without the
    integer arithmetic or the object): cheaper on a worker's hot path (measured:
    docs/benchmarks.md#figures-that-justified-design-choices)."""
    millis = "%012x" % (time.time_ns() // 1_000_000 & 0xFFFF_FFFF_FFFF)
    rand = _random10()
    h = rand.hex()  # 20 digits; 74 of their 80 bits are used
    return f"{millis[:8]}-{millis[8:]}-7{h[1:4]}-{_VARIANT[rand[2] >> 6]}{h[5:8]}-{h[8:]}"

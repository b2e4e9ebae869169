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

# The variant group opens with 0b10 then two random bits: the hex digit for each random nibble
# (its top two bits are the random ones), looked up rather than computed.
_VARIANT_OF = {f"{v:x}": "89ab"[v >> 2] for v in range(16)}

# Random digits drawn from the kernel RANDOM_IDS ids at a time (20 hex digits an id, made in one
# ``bytes.hex`` call for the whole buffer), not one system call or conversion per id.
# Thread-safe without a lock under the GIL: each buffer comes with its own counter, and next()
# on it hands every caller a different slice; a caller that finds the buffer used up installs a
# new pair (two callers racing there install two, each fresh) and takes its own digits
# directly. A forked child draws a buffer of its own at once, so parent and child never share
# digits (os.register_at_fork below).
RANDOM_IDS = 400
_pool: tuple[str, Iterator[int]]


def _fresh_pool() -> None:
    global _pool
    _pool = (os.urandom(10 * RANDOM_IDS).hex(), itertools.count())


_fresh_pool()


def _random20() -> str:
    """20 random hex digits (80 bits; an id uses 74 of them)."""
    digits, counter = _pool
    i = next(counter)
    if i < RANDOM_IDS:
        return digits[i * 20 : i * 20 + 20]
    _fresh_pool()
    return os.urandom(10).hex()


os.register_at_fork(after_in_child=_fresh_pool)

# The text before the random digits, for the millisecond it was made: ids made in one
# millisecond (a batch's facts and events) share it. Replaced whole, read whole: no lock.
_prefix: tuple[int, str] = (-1, "")


def new_id() -> str:
    """A new version-7 UUID string: 48 bits of milliseconds, then 74 random bits.

    Built as text (uuid.UUID's own text form, without the integer arithmetic or the object):
    the millisecond's part once a millisecond, the random part sliced from a buffer's hex
    digits; cheaper on a worker's hot path (measured:
    docs/benchmarks.md#figures-that-justified-design-choices)."""
    global _prefix
    millis = time.time_ns() // 1_000_000
    cached = _prefix
    if cached[0] == millis:
        head = cached[1]
    else:
        text = "%012x" % (millis & 0xFFFF_FFFF_FFFF)
        head = f"{text[:8]}-{text[8:]}-7"
        _prefix = (millis, head)
    h = _random20()
    return f"{head}{h[1:4]}-{_VARIANT_OF[h[4]]}{h[5:8]}-{h[8:]}"

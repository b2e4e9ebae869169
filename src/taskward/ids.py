"""Ids of stored rows: time-ordered UUIDs (RFC 9562 version 7).

Every run, fact, event, notification and schedule row gets one. The first 48 bits are the Unix
time in milliseconds, so ids made close together sort close together: new rows land on the same
few index pages instead of a random page each. With random (version 4) ids a store holding
millions of facts wrote 46 KiB of PostgreSQL WAL per task instead of 8, and a claim on SQLite
80 KiB instead of 30 (bench/depth.py, issue 7). Nothing reads order or time out of an id;
callers still treat ids as opaque strings. Random tokens that are not row ids (generated
idempotency keys, worker ids) stay version 4.
"""

from __future__ import annotations

import os
import time

_VERSION_7 = 0x7 << 76
_VARIANT_RFC = 0b10 << 62


def new_id() -> str:
    """A new version-7 UUID string: 48 bits of milliseconds, then 74 random bits."""
    millis = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")  # 80 bits; 74 are used
    rand_a = rand >> 68  # 12 bits
    rand_b = rand & ((1 << 62) - 1)  # 62 bits
    value = (millis & ((1 << 48) - 1)) << 80 | _VERSION_7 | rand_a << 64 | _VARIANT_RFC | rand_b
    h = f"{value:032x}"  # uuid.UUID's own text form, without building the object
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

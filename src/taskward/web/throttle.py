"""A per-client limit on FAILED authentication: API bearer tokens and dashboard logins.

Policy (docs/http.md "Failed authentication"): a client that fails ``max_failures`` times within
``window_s`` seconds is blocked for ``block_s`` seconds; each further block that follows without
a quiet window in between doubles, up to ``max_block_s``. While blocked, every attempt that
presents credentials is answered 429 with ``Retry-After`` and its credentials are NOT checked,
not even a correct token: accepting a correct token during a block would tell the guesser which
guess was right, so the block would slow nothing. A correct token is locked out at most
``max_block_s`` (60 s by default), and only on the address that is guessing. A success does not
reset the count (a caller holding a weak token must not be able to wash its guesses at a strong
one).

A client is its peer address (``scope["client"]``); IPv6 addresses count by their /64, the
smallest block one host usually holds; clients that share an address (behind a proxy not named
in ``TASKWARD_TRUSTED_PROXIES``, on one /64, or over a Unix socket) share one limit. Memory is
bounded: at most ``max_clients`` entries, the least recently failed one that is not blocked
evicted first. The table is per process: with several service
processes the limit holds in each.

Why not the ``limits`` library: its memory storage reads ``time.time()`` itself (tests would
sleep), runs an expiry timer thread, bounds no key count and has no growing block; this is
seventy lines with an injected clock.
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

UNKNOWN_CLIENT: Final = "unknown"
# How many of the least recently failed clients eviction looks past for one that is not blocked.
_EVICTION_SCAN: Final = 64


@dataclass(frozen=True)
class FailureLimits:
    """The thresholds; HttpConfig reads them from the environment (docs/http.md)."""

    max_failures: int = 10
    window_s: float = 60.0
    block_s: float = 5.0
    max_block_s: float = 60.0
    max_clients: int = 10_000


@dataclass
class _Client:
    failures: deque[float] = field(default_factory=deque)
    blocked_until: float = 0.0
    strikes: int = 0
    last_failure: float = 0.0


def client_key(host: str | None) -> str:
    """The limiter's key for a peer address: IPv4 as is, IPv6 by its /64 (an IPv4-mapped
    address as its IPv4), anything else (a Unix socket, a test client's name) as given."""
    if not host:
        return UNKNOWN_CLIENT
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host[:255]
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


class FailureLimiter:
    """Counts failed authentications per client and says when a client must wait.

    Runs on the event loop only (no awaits inside a method), so needs no lock.
    """

    def __init__(
        self, limits: FailureLimits | None = None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limits = limits or FailureLimits()
        self.clock = clock
        self._clients: OrderedDict[str, _Client] = OrderedDict()

    def __len__(self) -> int:
        return len(self._clients)

    def retry_after(self, client: str) -> int | None:
        """Whole seconds ``client`` must wait before presenting credentials again, or None."""
        entry = self._clients.get(client)
        if entry is None:
            return None
        remaining = entry.blocked_until - self.clock()
        return max(1, math.ceil(remaining)) if remaining > 0 else None

    def _evict_one(self, now: float) -> None:
        for n, (key, entry) in enumerate(self._clients.items()):
            if entry.blocked_until <= now or n >= _EVICTION_SCAN:
                del self._clients[key]
                return

    def failed(self, client: str) -> None:
        """Record one failed attempt of ``client``; it may start a block."""
        limits = self.limits
        now = self.clock()
        entry = self._clients.pop(client, None)
        if entry is None:
            entry = _Client()
            # Invariant: at most max_clients entries. The least recently failed client that is
            # not blocked goes first, so a flood of new addresses cannot wash out a block (the
            # look is bounded: past _EVICTION_SCAN blocked ones, the oldest goes anyway).
            while len(self._clients) >= limits.max_clients:
                self._evict_one(now)
        self._clients[client] = entry  # now the most recent
        if now - max(entry.last_failure, entry.blocked_until) > limits.window_s:
            entry.strikes = 0  # a quiet window after the last block forgives it
        entry.last_failure = now
        while entry.failures and entry.failures[0] <= now - limits.window_s:
            entry.failures.popleft()
        entry.failures.append(now)
        if len(entry.failures) >= limits.max_failures:
            entry.strikes += 1
            doubling = 2.0 ** min(entry.strikes - 1, 32)  # bounded: no float overflow
            block = min(limits.block_s * doubling, limits.max_block_s)
            entry.blocked_until = now + block
            entry.failures.clear()

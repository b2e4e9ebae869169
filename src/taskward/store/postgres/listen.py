"""Wake-ups across processes through LISTEN/NOTIFY: the channels' names on the wire and the
LISTEN connection.

A commit's NOTIFYs travel with its COMMIT (``_commit_sql``, sent by ``PostgresDB.transaction``);
the ``Listener`` holds one dedicated connection that LISTENs on every channel and bumps this
process's ``Signals`` for each notification. Invariants: NOTIFY and LISTEN name a channel the
same way (``_CHANNEL_PREFIX`` and a name of ``signals.CHANNELS``, nothing else); the LISTEN
connection re-establishes itself for as long as the store is open, and every time it is
(re)established it bumps every signal, since a notification sent while it was away is lost.

Underscored names are the dialect's own: its sibling modules import them, the rest of
taskward does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, Final

import psycopg
from psycopg.conninfo import conninfo_to_dict

from taskward.loops import raise_if_cancelling
from taskward.store.retry import Streak, outage_backoff
from taskward.store.signals import CHANNELS, Signals

log = logging.getLogger("taskward.store.postgres")

_CHANNEL_PREFIX = "taskward_"

LISTENER_BACKOFF: Final = outage_backoff(base_s=0.05, cap_s=2.0)


def notify_sql(channels: set[str]) -> bytes:
    """The NOTIFYs of ``channels`` (one simple query: no parameters), delivered when the
    transaction they run in commits. The channels come from ``signals.CHANNELS`` only
    (``_PgTx.notify`` refuses any other)."""
    return "".join(f"NOTIFY {_CHANNEL_PREFIX}{channel}; " for channel in sorted(channels)).encode()


def _commit_sql(channels: set[str]) -> bytes:
    """The NOTIFYs and the COMMIT in one round trip."""
    return notify_sql(channels) + b"COMMIT"


class Listener:
    """The LISTEN connection of one ``PostgresDB``: started by the first ``signal`` call,
    ended by ``close``. ``server_back`` is called when it connects again after failing (the
    server is back: the store refreshes its pool at once)."""

    def __init__(
        self,
        conninfo: str,
        signals: Signals,
        *,
        connect_timeout_s: float,
        server_back: Callable[[], None],
    ) -> None:
        self._conninfo = conninfo
        self._signals = signals
        self._connect_timeout_s = connect_timeout_s
        self._server_back = server_back
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        # How often the LISTEN connection was established (tests and diagnostics).
        self.connects = 0

    def start(self) -> None:
        """Start listening, once; nothing after ``close``."""
        if self._task is None and not self._closed:
            self._task = asyncio.get_running_loop().create_task(self._listen())

    async def close(self) -> None:
        """Stop listening and wait until the connection is closed; safe to call twice."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _params(self) -> dict[str, Any]:
        """The LISTEN connection: named, so operators can see it, and with TCP keepalives, so a
        silently dropped connection is noticed (libpq ignores them on Unix sockets)."""
        params = conninfo_to_dict(self._conninfo)
        app = str(params.get("application_name") or "taskward")
        extra: dict[str, Any] = {"application_name": f"{app}-listener"[:63]}
        for name, value in (
            ("keepalives", 1),
            ("keepalives_idle", 10),
            ("keepalives_interval", 5),
            ("keepalives_count", 3),
            ("connect_timeout", max(2, int(self._connect_timeout_s))),
        ):
            if name not in params:
                extra[name] = value
        return extra

    async def _listen(self) -> None:
        streak = Streak(LISTENER_BACKOFF, what="PostgreSQL LISTEN connection", logger=log)
        while not self._closed:
            raise_if_cancelling()
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self._conninfo, autocommit=True, **self._params()
                )
                async with conn:
                    for channel in CHANNELS:
                        await conn.execute(f"LISTEN {_CHANNEL_PREFIX}{channel}")
                    self.connects += 1
                    if streak.failures:
                        self._server_back()  # the server is back: refresh the pool now
                    streak.succeeded()
                    self._signals.bump()  # anything committed while we were not listening
                    async for note in conn.notifies():
                        name = note.channel.removeprefix(_CHANNEL_PREFIX)
                        if name in CHANNELS:
                            self._signals.bump(name)
                raise psycopg.OperationalError("the LISTEN connection ended")
            except (psycopg.Error, OSError) as exc:
                if self._closed:
                    return
                await asyncio.sleep(streak.failed(exc))

"""The port's wake-ups: ``Tx.notify``, ``StateDB.wake`` and ``StateDB.signal``, on both dialects.

An idle worker records a signal's ``seq``, looks for work, and waits for ``seq`` to change
(``store.signals``). A committed write that notifies must change it, in this process at once
and in another store on the same URL soon after (PostgreSQL: LISTEN/NOTIFY; SQLite: the
``data_version`` poll); a rolled-back one must not. Each test has a store of its own
(``quiet_url``): on PostgreSQL another test's notifications would otherwise reach it.
"""

from __future__ import annotations

import pytest

import taskward
from taskward.store.port import StateDB
from taskward.store.signals import CHANNELS, Signal
from tests.store.rows import insert_run

WAIT_S = 10.0


async def _listening(store: StateDB, writer: StateDB, channel: str = "queued") -> Signal:
    """``store``'s signal of ``channel`` once it watches other stores: the LISTEN connection
    (or the watcher's first reading) may come after the first commit, so commits of
    ``writer`` follow until ``store`` wakes (bounded; each wait ends early). They notify
    nobody, so that none is delivered late: on PostgreSQL what wakes ``store`` is the LISTEN
    connection's own wake-up once it listens, on SQLite the poll that saw the commit."""
    signal = store.signal(channel)
    for _ in range(20):
        seen = signal.seq
        async with writer.transaction() as tx:
            await tx.execute("setting_put", {"name": "warm-up", "value": "1"})
        if await signal.wait(seen, 1.0):
            return signal
    pytest.fail(f"no commit of another store woke {channel!r}")


async def test_a_committed_notify_bumps_the_signal_at_commit(quiet_url: str) -> None:
    """``Tx.notify(channel)`` wakes this process's waiters on ``channel`` once the transaction
    commits: not before, and on no other channel."""
    async with taskward.open_db(quiet_url) as db, taskward.open_db(quiet_url) as writer:
        # Watching other stores first: the LISTEN connection's first wake-up (which wakes every
        # channel, in case it missed one) is then behind us.
        queued, cancel = await _listening(db, writer), db.signal("cancel")
        async with db.transaction() as tx:
            seen, seen_cancel = queued.seq, cancel.seq
            waiting = queued.changed(seen, WAIT_S)
            await insert_run(tx)
            tx.notify("queued")
            assert queued.seq == seen and not waiting.done()  # the write is not visible yet
        assert queued.seq > seen
        assert await waiting is True
        assert cancel.seq == seen_cancel


async def test_a_rolled_back_notify_wakes_nobody(quiet_url: str) -> None:
    """A transaction that rolls back sends no wake-up: its ``notify`` is dropped with its
    writes."""
    async with taskward.open_db(quiet_url) as db, taskward.open_db(quiet_url) as writer:
        signal = await _listening(db, writer)
        seen = signal.seq
        with pytest.raises(RuntimeError):
            async with db.transaction() as tx:
                await insert_run(tx)
                tx.notify("queued")
                raise RuntimeError("roll back")
        assert signal.seq == seen
        assert await signal.wait(seen, 0.3) is False  # nor later, through LISTEN


async def test_wake_bumps_one_channel_at_once(quiet_url: str) -> None:
    """``StateDB.wake(channel)``: this process's waiters on ``channel`` wake now, with no
    transaction (after a write whose SQL notifies other processes itself)."""
    async with taskward.open_db(quiet_url) as db:
        for channel in CHANNELS:
            signals = {name: db.signal(name) for name in CHANNELS}
            seen = {name: signal.seq for name, signal in signals.items()}
            db.wake(channel)
            assert {name: s.seq - seen[name] for name, s in signals.items()} == {
                name: int(name == channel) for name in CHANNELS
            }


async def test_another_stores_commit_wakes_this_store(quiet_url: str) -> None:
    """Two stores on one URL (two processes): a commit that notifies in one wakes the other's
    waiters (PostgreSQL: NOTIFY at COMMIT reaches LISTEN; SQLite: the ``data_version`` poll),
    and so does a statement outside a transaction that admits a run (its SQL notifies on
    PostgreSQL); a rolled-back one does not."""
    async with taskward.open_db(quiet_url) as db, taskward.open_db(quiet_url) as other:
        signal = await _listening(db, other)

        seen = signal.seq
        async with other.transaction() as tx:
            # A write whose SQL notifies nobody itself (run_insert_if_new's does, on PostgreSQL)
            await tx.execute("setting_put", {"name": "probe", "value": "1"})
            tx.notify("queued")
        assert await signal.wait(seen, WAIT_S) is True

        seen = signal.seq
        with pytest.raises(RuntimeError):
            async with other.transaction() as tx:
                await insert_run(tx)
                tx.notify("queued")
                raise RuntimeError("roll back")
        assert await signal.wait(seen, 0.3) is False

        await insert_run(other)  # run_insert_if_new on its own
        assert await signal.wait(seen, WAIT_S) is True


async def test_a_cancel_notify_reaches_another_stores_cancel_signal(quiet_url: str) -> None:
    """The ``cancel`` channel travels as ``queued`` does: a running task's owner learns of a
    cancellation committed by another store."""
    async with taskward.open_db(quiet_url) as db, taskward.open_db(quiet_url) as other:
        signal = await _listening(db, other, "cancel")
        seen = signal.seq
        async with other.transaction() as tx:
            await tx.execute("setting_put", {"name": "probe", "value": "1"})
            tx.notify("cancel")
        assert await signal.wait(seen, WAIT_S) is True

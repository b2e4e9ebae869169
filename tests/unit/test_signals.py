"""In-process wake-up signals (taskward.store.signals): a bump between a look and a wait is
never lost, a wait resolves at the bump, and no ended wait is kept."""

from __future__ import annotations

import asyncio

import pytest

from taskward.store.signals import Signal, Signals


async def test_a_wait_resolves_true_at_the_bump() -> None:
    signal = Signal()
    seen = signal.seq
    changed = signal.changed(seen, None)
    await asyncio.sleep(0)
    assert not changed.done()
    signal.bump()
    assert changed.done() and changed.result() is True  # resolved by the bump itself


async def test_a_bump_between_the_look_and_the_wait_is_not_lost() -> None:
    signal = Signal()
    seen = signal.seq  # the caller looks for work here...
    signal.bump()  # ...work arrives before it waits
    assert await signal.wait(seen, None) is True
    assert signal.changed(seen, 30.0).result() is True  # already done: nothing to wait for


async def test_a_wait_that_runs_out_resolves_false() -> None:
    signal = Signal()
    assert await signal.wait(signal.seq, 0.001) is False


async def test_ended_waits_are_not_kept() -> None:
    """Timed out, cancelled or resolved: each wait leaves the signal, so an idle worker that
    waits in a loop for days, with nothing bumping, holds no growing set of futures."""
    signal = Signal()
    for _ in range(50):
        assert await signal.wait(signal.seq, 0.0) is False
    cancelled = signal.changed(signal.seq, None)
    waiter = asyncio.ensure_future(signal.wait(signal.seq, None))
    await asyncio.sleep(0)
    assert len(signal._waiters) == 2
    cancelled.cancel()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await asyncio.sleep(0)  # done callbacks run at the next turn
    assert not signal._waiters


async def test_a_cancelled_waiter_is_cancelled_even_when_the_bump_came_first() -> None:
    """A cancellation that races the bump is delivered, never swallowed."""
    signal = Signal()
    waiter = asyncio.ensure_future(signal.wait(signal.seq, None))
    await asyncio.sleep(0)
    signal.bump()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter


async def test_signals_bump_named_channels_or_all() -> None:
    signals = Signals()
    queued, cancel = signals.get("queued"), signals.get("cancel")
    signals.bump("queued")
    assert (queued.seq, cancel.seq) == (1, 0)
    signals.bump()
    assert (queued.seq, cancel.seq) == (2, 1)

"""Group commit: many small write units that arrive together share one transaction.

Each unit keeps its own statements (a transition keeps its own compare-and-swap, fact and event);
only the COMMIT — and on SQLite with ``synchronous=FULL`` its fsync — is shared. Batching is
natural: a unit submitted while nothing is in flight commits at once, alone; units submitted
while a commit is in flight wait for it and then commit together. Nobody waits for a timer.

If any unit of a batch raises, the batch's transaction is rolled back whole and every unit runs
again through its own fallback (its ordinary single-transaction path), so a unit's error or
conflict is reported exactly as it would have been without batching, and no unit's write is ever
lost or applied twice.

Slow start: the first batch after an idle spell takes at most ``SLOW_START_BATCH`` units and each
following batch twice as many, up to ``max_batch``. Units that arrive together after idling are
usually tasks that finished together; answering the first few after a short transaction lets
them restart while the rest commit, so a host's tasks spread out instead of moving in lockstep
(all of them waiting for one long transaction, then all of them sleeping while the store idles).
Under a steady backlog the flusher never idles and batches stay at ``max_batch``. Slow start
brings a host of tasks that await closer to its ideal rate and leaves a no-op drain as it was
(measured: docs/benchmarks.md#figures-that-justified-design-choices).

Lanes: up to ``lanes`` batches are in flight at once, each its own transaction. SQLite has one
writer, so one lane. PostgreSQL has two: with one, the worker and the server took turns, each
idle while the other worked; a second lane lets the worker build and the server run a batch each
(a faster drain), a third added nothing (measured:
docs/benchmarks.md#figures-that-justified-design-choices).

Units of one *kind* (``run_many``) are handed to their kind's ``combine`` together, so that a
batch of, say, forty terminal transitions is one set-based compare-and-swap statement plus one
pipelined round of inserts instead of forty sequences of statements; ``combine`` returns one
result per item, in order, and keeps every item's own semantics (a transition keeps its own
compare-and-swap, fact and event).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

from taskward.store.port import StateDB, Tx

T = TypeVar("T")
I = TypeVar("I")  # noqa: E741 - an item of a combinable kind

DEFAULT_MAX_BATCH: Final = 64
SLOW_START_BATCH: Final = 2
FOLLOWER_TURNS: Final = 4


Combine = Callable[[Tx, list[Any]], Awaitable[list[Any]]]

POSTGRES_LANES: Final = 2


def default_lanes(db: StateDB) -> int:
    """One transaction in flight where the store has one writer (SQLite), two where it takes
    several (PostgreSQL)."""
    return POSTGRES_LANES if db.concurrent_writers else 1


@dataclass
class _Pending(Generic[T]):
    unit: Callable[[Tx], Awaitable[T]] | None
    fallback: Callable[[], Awaitable[T]]
    future: asyncio.Future[T]
    kind: str | None = None
    item: Any = None
    combine: Combine | None = None


class GroupCommit:
    def __init__(
        self, db: StateDB, *, max_batch: int = DEFAULT_MAX_BATCH, lanes: int | None = None
    ) -> None:
        self.db = db
        self.max_batch = max_batch
        # Transactions in flight at once. SQLite has one writer: one lane. PostgreSQL: two, so
        # that the worker builds the next batch while the server runs the previous one instead
        # of the two taking turns (each waited on the other about half the time). Each batch
        # is a transaction of its own on its own connection; rows never meet across lanes (a
        # task's units are sequential, and claims skip rows another transaction locked).
        self.lanes = lanes if lanes is not None else default_lanes(db)
        if self.lanes < 1:
            raise ValueError("lanes must be at least 1")
        self._queue: list[_Pending[Any]] = []
        self._flushers: set[asyncio.Task[None]] = set()
        self.batches = 0
        self.units = 0

    @property
    def flushing(self) -> int:
        """Batches being taken or committed right now (0: idle; the next burst starts small)."""
        return sum(not flusher.done() for flusher in self._flushers)

    async def run(
        self, unit: Callable[[Tx], Awaitable[T]], *, fallback: Callable[[], Awaitable[T]]
    ) -> T:
        """Run ``unit`` inside a shared transaction; return its result once committed."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        return await self._enqueue(_Pending(unit, fallback, future))

    async def run_many(
        self,
        kind: str,
        item: I,
        combine: Callable[[Tx, list[I]], Awaitable[list[T]]],
        *,
        fallback: Callable[[], Awaitable[T]],
    ) -> T:
        """Like ``run``, for an item that ``combine`` applies together with the other items of
        ``kind`` in the same batch (one call per kind and batch, results in item order)."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        return await self._enqueue(_Pending(None, fallback, future, kind, item, combine))

    async def _enqueue(self, pending: _Pending[T]) -> T:
        self._queue.append(pending)
        # A flusher that found the queue empty is done at once (no await after that check),
        # though its discard callback has not run yet: count only those still working.
        if self.flushing < self.lanes:
            flusher = asyncio.create_task(self._flush())
            self._flushers.add(flusher)
            flusher.add_done_callback(self._flushers.discard)
        # Awaited directly, not behind a shield: a cancelled caller cancels its future, and the
        # flusher still applies its unit (only an unanswered future is answered), so the unit
        # commits either way, as it must once queued; the caller wakes one loop turn sooner.
        return await pending.future

    async def _flush(self) -> None:
        batch: list[_Pending[Any]] = []
        try:
            await self._drain_queue(batch)
        finally:
            for pending in batch:  # only when the flusher itself was cancelled mid-batch
                if not pending.future.done():
                    pending.future.set_exception(asyncio.CancelledError())

    async def _drain_queue(self, batch: list[_Pending[Any]]) -> None:
        size = min(SLOW_START_BATCH, self.max_batch)
        # A new flusher takes the queue as it finds it: no commit of its own has just answered
        # callers who would follow at once (``_let_followers_in``), and an idle worker's claim
        # is this path (issue 7: pickup latency). Later batches let followers in first.
        fresh = True
        while True:
            if not fresh:
                await self._let_followers_in()
            fresh = False
            if not self._queue:
                return
            batch[:] = self._queue[:size]
            self._queue = self._queue[size:]
            size = min(self.max_batch, size * 2)
            self.batches += 1
            self.units += len(batch)
            # A batch of one takes the same path: its unit in a transaction of its own, with
            # the fallback only on an error (a lone claim pass is one transaction this way).
            try:
                async with self.db.transaction() as tx:
                    results = await self._apply(tx, batch)
            except Exception:
                # One unit failed: nothing of the batch committed; each runs on its own.
                await asyncio.gather(*(self._alone(p) for p in batch))
                continue
            for pending, result in zip(batch, results, strict=True):
                if not pending.future.done():
                    pending.future.set_result(result)

    async def _let_followers_in(self) -> None:
        """A few turns of the event loop before a batch is taken.

        The callers a commit just answered usually submit their next unit at once (a host
        writes a summary, then completes; completes, then claims), but each needs a few loop
        turns to get there. Taking the next batch without them would make each such unit wait
        for a whole extra commit; waiting for them costs microseconds. Never a timer.
        """
        for _ in range(FOLLOWER_TURNS):
            if len(self._queue) >= self.max_batch:
                return
            await asyncio.sleep(0)

    @staticmethod
    async def _apply(tx: Tx, batch: list[_Pending[Any]]) -> list[Any]:
        """Every unit of ``batch`` inside ``tx``: plain units one by one, each kind's items in
        one ``combine`` call. Results in batch order."""
        results: list[Any] = [None] * len(batch)
        kinds: dict[str, list[int]] = {}
        for index, pending in enumerate(batch):
            if pending.kind is None:
                assert pending.unit is not None
                results[index] = await pending.unit(tx)
            else:
                kinds.setdefault(pending.kind, []).append(index)
        for indexes in kinds.values():
            combine = batch[indexes[0]].combine
            assert combine is not None
            combined = await combine(tx, [batch[i].item for i in indexes])
            if len(combined) != len(indexes):
                raise RuntimeError("combine returned a result count unlike its item count")
            for index, result in zip(indexes, combined, strict=True):
                results[index] = result
        return results

    @staticmethod
    async def _alone(pending: _Pending[Any]) -> None:
        try:
            result = await pending.fallback()
        except BaseException as exc:
            if not pending.future.done():
                pending.future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        if not pending.future.done():
            pending.future.set_result(result)

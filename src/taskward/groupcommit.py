"""Group commit: many small write units that arrive together share one transaction.

Each unit keeps its own statements (a transition keeps its own compare-and-swap, fact and event);
only the COMMIT — and on SQLite with ``synchronous=FULL`` its fsync — is shared. Batching is
natural: a unit submitted while nothing is in flight commits at once, alone; units submitted
while a commit is in flight wait for it and then commit together. Nobody waits for a timer.

If any unit of a batch raises, the batch's transaction is rolled back whole and every unit runs
again through its own fallback (its ordinary single-transaction path), so a unit's error or
conflict is reported exactly as it would have been without batching, and no unit's write is ever
lost or applied twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

from taskward.store.port import StateDB, Tx

T = TypeVar("T")

DEFAULT_MAX_BATCH: Final = 64


@dataclass
class _Pending(Generic[T]):
    unit: Callable[[Tx], Awaitable[T]]
    fallback: Callable[[], Awaitable[T]]
    future: asyncio.Future[T]


class GroupCommit:
    def __init__(self, db: StateDB, *, max_batch: int = DEFAULT_MAX_BATCH) -> None:
        self.db = db
        self.max_batch = max_batch
        self._queue: list[_Pending[Any]] = []
        self._flusher: asyncio.Task[None] | None = None
        self.batches = 0
        self.units = 0

    async def run(
        self, unit: Callable[[Tx], Awaitable[T]], *, fallback: Callable[[], Awaitable[T]]
    ) -> T:
        """Run ``unit`` inside a shared transaction; return its result once committed."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(unit, fallback, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        return await asyncio.shield(future)

    async def _flush(self) -> None:
        batch: list[_Pending[Any]] = []
        try:
            await self._drain_queue(batch)
        finally:
            for pending in batch:  # only when the flusher itself was cancelled mid-batch
                if not pending.future.done():
                    pending.future.set_exception(asyncio.CancelledError())

    async def _drain_queue(self, batch: list[_Pending[Any]]) -> None:
        while self._queue:
            batch[:] = self._queue[: self.max_batch]
            self._queue = self._queue[self.max_batch :]
            self.batches += 1
            self.units += len(batch)
            if len(batch) == 1:
                await self._alone(batch[0])
                continue
            results: list[Any] = []
            try:
                async with self.db.transaction() as tx:
                    for pending in batch:
                        results.append(await pending.unit(tx))
            except Exception:
                # One unit failed: nothing of the batch committed; each runs on its own.
                await asyncio.gather(*(self._alone(p) for p in batch))
                continue
            for pending, result in zip(batch, results, strict=True):
                if not pending.future.done():
                    pending.future.set_result(result)

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

"""Mutant (c), loaded with ``-p``: the resident host acknowledges completion before it runs the
task and writes its summary (breaks ADR-0037 D4, summary before complete)."""

from __future__ import annotations

from taskward.host.engine_host import ResidentEngineHost, session_key_for
from taskward.host.models import Task, TaskResult
from tests.mutants._profile import pytest_configure  # noqa: F401 (a hook of this plugin)

_run_job = ResidentEngineHost._job


async def _ack_first(self: ResidentEngineHost, task: Task) -> None:
    key = session_key_for(task)
    await self.source.complete(
        task.id, task.lease_id, TaskResult(run_id=key, status="completed", summary_ref=key)
    )
    await _run_job(self, task)


ResidentEngineHost._job = _ack_first  # type: ignore[method-assign]

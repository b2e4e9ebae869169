"""The in-tree SummaryStore (ADR-0037 D4, D6): ``LocalSummaryStore`` keeps summaries in the
``task_summaries`` table; its rows hold the canonical JSON of the summary and its hash.
"""

from __future__ import annotations

import math
from typing import Any, Final

from taskward.canonical import canonical_json, json_string, plain_canonical_json, text_hash
from taskward.groupcommit import GroupCommit
from taskward.host.models import SessionSummary
from taskward.store.port import Row, StateDB, Tx


class SummaryConflict(ValueError):
    """A different summary was written for a session key that is already complete (D4)."""


async def _write_summaries(tx: Tx, params: list[dict[str, Any]]) -> list[Row | None]:
    """GroupCommit's combine for summaries: one multi-row ``summary_write_many``; a session
    whose row was not written gets None, exactly as ``summary_write`` alone would answer."""
    if await _all_summaries_written(tx, params):
        return [{"session_key": p["session_key"]} for p in params]
    # Some row was complete already (a replay or a conflict). Ours are those holding this
    # transaction's time and our hash; a row complete before now is another write's.
    rows = await tx.fetch_batch(
        [("summary_get", {"session_key": p["session_key"]}) for p in params]
    )
    return [
        {"session_key": p["session_key"]}
        if row is not None
        and row["updated_at"] == tx.now
        and row["summary_hash"] == p["summary_hash"]
        else None
        for p, row in zip(params, rows, strict=True)
    ]


async def _all_summaries_written(tx: Tx, params: list[dict[str, Any]]) -> bool:
    """Write every summary; True when each was written (none was complete already)."""
    [count] = await tx.write_many([("summary_write_many", params)])
    return count == len(params)


# The facts the host writes for every task (job.HostJobs._summary), in
# sorted order: what ``_host_facts_json`` splices.
HOST_FACT_KEYS: Final = (
    "artifact_refs",
    "attempt",
    "degrade_reason",
    "degraded",
    "elapsed_ms",
    "ended_at",
    "operation_statuses",
    "run_id",
    "started_at",
    "task_id",
    "usage",
)
_HOST_FACT_SET: Final = frozenset(HOST_FACT_KEYS)


def _host_facts_json(facts: dict[str, Any]) -> str | None:
    """``canonical_json(facts)`` for the host's own facts, spliced key by key in sorted
    order (the summary of every task); None for any other shape or a value of another type."""
    if facts.keys() != _HOST_FACT_SET:
        return None
    attempt, elapsed, degraded = facts["attempt"], facts["elapsed_ms"], facts["degraded"]
    strings = (
        facts["degrade_reason"],
        facts["ended_at"],
        facts["run_id"],
        facts["started_at"],
        facts["task_id"],
    )
    if (
        type(attempt) is not int
        or type(elapsed) is not float
        or not math.isfinite(elapsed)
        or type(degraded) is not bool
        or any(type(value) is not str for value in strings)
    ):
        return None
    refs = plain_canonical_json(facts["artifact_refs"])
    statuses = plain_canonical_json(facts["operation_statuses"])
    usage = plain_canonical_json(facts["usage"])
    if refs is None or statuses is None or usage is None:
        return None
    reason, ended, run_id, started, task_id = (json_string(value) for value in strings)
    return (
        f'{{"artifact_refs":{refs},"attempt":{attempt!r},"degrade_reason":{reason},'
        f'"degraded":{"true" if degraded else "false"},"elapsed_ms":{elapsed!r},'
        f'"ended_at":{ended},"operation_statuses":{statuses},"run_id":{run_id},'
        f'"started_at":{started},"task_id":{task_id},"usage":{usage}}}'
    )


def summary_json(summary: SessionSummary) -> str:
    """The canonical JSON of ``summary.model_dump(mode="json")``, which the summary row stores
    and hashes. The host's own summaries hold plain JSON facts and are encoded directly (every
    task finishes through here; its usual facts spliced by ``_host_facts_json``); anything else
    goes through the model. Tests hold the two equal."""
    if type(summary) is SessionSummary:
        facts = _host_facts_json(summary.facts)
        narrative = summary.narrative
        if facts is not None and (narrative is None or type(narrative) is str):
            return (
                f'{{"facts":{facts},"manifest_ref":{json_string(summary.manifest_ref)},'
                f'"narrative":{"null" if narrative is None else json_string(narrative)}}}'
            )
        text = plain_canonical_json(
            {
                "facts": summary.facts,
                "manifest_ref": summary.manifest_ref,
                "narrative": summary.narrative,
            }
        )
        if text is not None:
            return text
    return canonical_json(summary.model_dump(mode="json"))


class LocalSummaryStore:
    """A SummaryStore over the ``task_summaries`` table (D4 semantics)."""

    def __init__(self, db: StateDB, *, group: GroupCommit | None = None) -> None:
        self.db = db
        self.group = group if group is not None else GroupCommit(db)

    @staticmethod
    def _split(session_key: str) -> tuple[str | None, int | None]:
        task_id, sep, attempt = session_key.rpartition(":")
        if sep and attempt.isdigit():
            return task_id, int(attempt)
        return None, None

    def params(self, session_key: str, summary: SessionSummary) -> dict[str, Any]:
        """The ``summary_write`` parameters for ``summary`` under ``session_key``."""
        text = summary_json(summary)
        task_id, attempt = self._split(session_key)
        return {
            "session_key": session_key,
            "task_id": task_id,
            "attempt": attempt,
            "summary": text,
            "summary_hash": text_hash(text),
        }

    async def write(
        self, session_key: str, summary: SessionSummary, *, alone: bool = False
    ) -> None:
        """Insert, or complete a pending row; summaries finishing together share one commit
        and one pipelined round of statements (``alone``: a transaction of its own)."""
        params = self.params(session_key, summary)
        if alone:
            written = await self.db.fetchone("summary_write", params)
        else:
            written = await self.group.run_many(
                "summary_write",
                params,
                _write_summaries,
                fallback=lambda: self.db.fetchone("summary_write", params),
            )
        if written is not None:
            return
        existing = await self.db.fetchone("summary_get", {"session_key": session_key})
        if existing is None or existing["summary_hash"] != params["summary_hash"]:
            raise SummaryConflict(
                f"session {session_key!r} already has a different complete summary"
            )

    async def mark_pending(self, session_key: str, reason: str) -> None:
        task_id, attempt = self._split(session_key)
        await self.db.fetchone(
            "summary_mark_pending",
            {
                "session_key": session_key,
                "task_id": task_id,
                "attempt": attempt,
                "reason": reason[:4000],
            },
        )

    async def get(self, session_key: str) -> Row | None:
        return await self.db.fetchone("summary_get", {"session_key": session_key})


__all__ = ["LocalSummaryStore", "SummaryConflict", "summary_json"]

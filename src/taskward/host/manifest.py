"""The host's manifest references (``engine_host.manifest_ref_for``) resolved over the store."""

from __future__ import annotations

from typing import Any

from taskward.store.port import StateDB


async def resolve_manifest(db: StateDB, manifest_ref: str) -> dict[str, Any]:
    """Resolve a host manifest reference to the run's row, facts and summary."""
    from urllib.parse import parse_qs, urlsplit

    parts = urlsplit(manifest_ref)
    if parts.scheme != "taskward" or not parts.path.startswith("schedule_runs/"):
        raise ValueError(f"not a taskward manifest reference: {manifest_ref!r}")
    task_id = parts.path.removeprefix("schedule_runs/")
    attempt = int(parse_qs(parts.query).get("attempt", ["0"])[0])
    row = await db.fetchone("run_get", {"id": task_id})
    facts = await db.fetchall("fact_list", {"entity_id": task_id})
    summary = await db.fetchone("summary_get", {"session_key": f"{task_id}:{attempt}"})
    # That attempt's lease is the one its claim fact recorded; the row only holds the latest.
    lease = next(
        (
            f["lease_id"]
            for f in facts
            if f["status"] == "running"
            and f["lease_id"]
            and str(f["lease_id"]).rpartition("/")[2] == str(attempt)
        ),
        None,
    )
    return {
        "row": row,
        "facts": facts,
        "summary": summary,
        "lease_id": lease,
    }


__all__ = ["resolve_manifest"]

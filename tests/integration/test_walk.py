"""The walk of a claimed task (issue 24): from ``LocalTaskSource.claim_many`` to its claim's
write, and from its acknowledgement to its terminal write, the modules the call crosses.

Recorded with ``sys.setprofile`` on a real store: the chain of taskward modules on the stack
(consecutive frames of one module counted once) when a unit enters the group commit, and when
the group commit's transaction reaches the store's guarded write. The two halves of each path
(the caller's, and the group commit's flusher, which runs the unit in its own task) are the
walk. It must not grow: a new hop between the source and the store fails here, and the docs
(docs/architecture.md "A claimed task's walk") quote these chains.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from taskward.claims import WorkerSpec
from taskward.host.models import TaskResult
from taskward.host.source import LocalTaskSource
from taskward.store.port import StateDB

from .helpers import submit

_ENTRIES = {
    ("taskward.groupcommit", "run"),
    ("taskward.groupcommit", "run_many"),
}
_WRITES = frozenset({"run_update_if", "run_update_many", "claim_queued", "finish_running"})


def _chain(frame: FrameType | None) -> list[str]:
    chain: list[str] = []
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.startswith("taskward") and (not chain or chain[-1] != module):
            chain.append(module)
        frame = frame.f_back
    return [m.removeprefix("taskward.") for m in reversed(chain)]


@contextmanager
def _recorded() -> Iterator[list[tuple[str, list[str]]]]:
    seen: list[tuple[str, list[str]]] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        module, name = frame.f_globals.get("__name__", ""), frame.f_code.co_name
        if (module, name) in _ENTRIES:
            seen.append(("enter", _chain(frame)))
        elif module.startswith("taskward.store") and name in _WRITES:
            seen.append(("write", _chain(frame)))

    sys.setprofile(profile)
    try:
        yield seen
    finally:
        sys.setprofile(None)


def _packages(chain: list[str]) -> list[str]:
    """A chain at package granularity (``transitions.apply`` is ``transitions``)."""
    out: list[str] = []
    for module in chain:
        top = module.split(".")[0] if module.split(".")[0] in {
            "transitions", "claims", "store"
        } else module  # fmt: skip
        if not out or out[-1] != top:
            out.append(top)
    return out


async def test_a_claimed_tasks_walk_crosses_at_most_eight_modules(db: StateDB) -> None:
    for _ in range(2):
        await submit(db)
    source = LocalTaskSource(db, WorkerSpec(worker_id="host:walk0001", kinds=["command"]))
    with _recorded() as claim:
        [task] = await source.claim_many(1)
    with _recorded() as finish:
        ack = await source.complete(
            task.id,
            task.lease_id,
            TaskResult(run_id=f"{task.id}:1", status="completed", summary_ref=f"{task.id}:1"),
        )
    assert ack.applied
    claim_entry = next(c for kind, c in claim if kind == "enter")
    claim_write = next(c for kind, c in claim if kind == "write")
    finish_entry = next(c for kind, c in finish if kind == "enter")
    finish_write = next(c for kind, c in finish if kind == "write")
    # The caller's half: the source asks claims, which hands its pass to the group commit.
    assert _packages(claim_entry) == ["host.source", "claims", "groupcommit"]
    # The flusher's half: the pass's claims are moves written by transitions.apply.
    assert _packages(claim_write) == ["groupcommit", "claims", "transitions", "store"]
    # The acknowledgement: the source judges it through execution's outcome table; the
    # terminal build joins the group commit, whose combine is transitions' apply_built.
    assert _packages(finish_entry) == ["host.source", "execution", "transitions", "groupcommit"]
    assert _packages(finish_write) == ["groupcommit", "transitions", "store"]
    walk = {
        m
        for chain in (claim_entry, claim_write, finish_entry, finish_write)
        for m in _packages(chain)
    }
    assert walk == {"host.source", "claims", "groupcommit", "transitions", "store", "execution"}
    assert len(walk) <= 8

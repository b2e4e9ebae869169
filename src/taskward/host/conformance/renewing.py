"""The optional conformance case of ADR-0037 protocol version two (DESIGN.md R25): lease renewal,
the ``RenewsLeases`` port. A source without it still conforms to version one (the ten cases);
an implementation that renews runs this case too (``OPTIONAL_CASES``), its harness making a
renewing source (``ConformanceHarness.make_renewing_source``).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, Final

from taskward.host.conformance.harness import (
    ACCEPTED,
    MISSING,
    STALE,
    CallLog,
    ConformanceHarness,
    RecordingRenewingSource,
    RecordingSummaryStore,
    _ack_calls_settled,
    _check_claimed,
    _expect,
    _expect_status,
    _host,
    _one,
    _result,
    _run_forever,
    _serving,
    _stop_after,
    _summary,
    wait_until,
)
from taskward.host.engine_host import session_key_for
from taskward.host.models import Task
from taskward.host.ports import RenewsLeases

# The case renews by calling the host's pass itself (never waiting for its timer) and lets a run
# whose lease was lost stop at once.
NO_TIMER_S: Final = 3600.0
LOST_GRACE_S: Final = 0.05


async def lease_renewal_extends_the_held_lease_and_a_lost_lease_stops_its_run(
    h: ConformanceHarness,
) -> None:
    """R25: ``renew()`` under the held lease is accepted, again and again, and records no state
    change; under any other lease (a forged id, a lease that lapsed and was reclaimed, a task
    that ended) it is ``stale_lease`` and changes nothing; an unknown or never-leased task is
    ``missing_holder``. The holder's completion after renewals applies. A host that renews stops
    a run whose renewal lost, and that run's acknowledgement is refused (D2); the new holder
    completes the task."""
    renewing = await h.make_renewing_source()
    _expect(isinstance(renewing, RenewsLeases), "make_renewing_source() has no renew() (R25)")
    assert isinstance(renewing, RenewsLeases)
    task_id = await h.enqueue(objective="renewed")
    never = await h.enqueue(objective="never leased")
    task = _check_claimed(await renewing.claim(), "renewing source")
    _expect(task.id in {task_id, never}, f"claimed an unknown task {task.id}")
    if task.id != task_id:  # either may come first: the other is the never-leased one
        task_id, never = never, task_id
    recorded = list(await h.history(task_id))
    for _ in range(3):
        ack = await renewing.renew(task.id, task.lease_id)
        _expect(ack == ACCEPTED, f"renew() under the held lease returned {ack!r}")
    _expect(list(await h.history(task_id)) == recorded, "a renewal recorded a state change")
    await _expect_status(h, task_id, "leased", "a renewal keeps the lease")
    forged = await renewing.renew(task.id, f"{task.lease_id}-forged")
    _expect(forged == STALE, f"renew() under a mismatched lease id returned {forged!r}")
    unknown = await renewing.renew(f"no-such-task-{uuid.uuid4()}", task.lease_id)
    _expect(unknown == MISSING, f"renew() of an unknown task returned {unknown!r}")
    unheld = await renewing.renew(never, task.lease_id)
    _expect(unheld == MISSING, f"renew() of a never-leased task returned {unheld!r}")
    await _expect_status(h, never, "queued", "a renewal of a never-leased task changes nothing")
    await h.summaries.write(session_key_for(task), _summary(task))
    done = await renewing.complete(task.id, task.lease_id, _result(task))
    _expect(done == ACCEPTED, f"complete() after renewals returned {done!r}")
    ended = await renewing.renew(task.id, task.lease_id)
    _expect(ended == STALE, f"renew() after the task completed returned {ended!r}")
    await _expect_status(h, task_id, "completed", "a renewal after the end changes nothing")
    rest = _check_claimed(await renewing.claim(), "renewing source")  # the queue empties
    _expect(rest.id == never, f"claimed {rest.id}, expected {never}")
    await h.summaries.write(session_key_for(rest), _summary(rest))
    done = await renewing.complete(rest.id, rest.lease_id, _result(rest))
    _expect(done == ACCEPTED, f"complete() without renewals returned {done!r}")

    lost_id = await h.enqueue(objective="lease lost")
    log = CallLog()
    started = asyncio.Event()
    stopped: list[str] = []

    async def run_task(task: Task, session: Any) -> dict[str, Any]:
        started.set()
        try:
            return await _run_forever(task, session)
        except asyncio.CancelledError:
            stopped.append(task.id)
            raise

    async def running() -> bool:
        return started.is_set()

    host = _host(
        RecordingRenewingSource(await h.make_renewing_source(), log),
        RecordingSummaryStore(h.summaries, log),
        run_task=run_task,
        max_concurrent_tasks=1,  # busy with its task: it cannot claim it back itself
        should_stop_claiming=_stop_after(log, 1),
        renew_every_s=NO_TIMER_S,
        lease_lost_grace_s=LOST_GRACE_S,
    )
    async with _serving(host) as serve:
        await wait_until(running, "the task to run", serving=serve)
        claimed = log.claimed()
        _expect(len(claimed) == 1, f"expected one claim, saw {claimed!r}")
        held = claimed[0]
        _expect(held.id == lost_id, f"the host claimed {held.id}, expected {lost_id}")
        renewed = await host.renew_leases()
        _expect(renewed == 1, f"the host renewed {renewed} leases, holding one")
        await h.expire_lease(lost_id)  # the host looks dead: its lease lapses
        other = await h.make_source()
        new = _check_claimed(await other.claim(), "another source")
        _expect(new.id == lost_id, f"reclaimed {new.id}, expected {lost_id}")
        _expect(new.attempt == held.attempt + 1, f"reclaim attempt {new.attempt}")
        recorded = list(await h.history(lost_id))
        renewed = await host.renew_leases()
        _expect(renewed == 0, "the host renewed a lease that was reclaimed")
        await wait_until(
            lambda: _ack_calls_settled(log, [lost_id]), "the lost run to end", serving=serve
        )
    refused = log.of("renew", lost_id)[-1]
    _expect(refused.outcome == STALE, f"renew() of a reclaimed lease returned {refused.outcome!r}")
    _expect(stopped == [lost_id], f"the host did not stop the run whose lease was lost: {stopped}")
    _expect(not log.of("complete", lost_id), "the run whose lease was lost was completed")
    fail = _one(log.of("fail", lost_id), f"fail of {lost_id}")
    _expect(fail.outcome == STALE, f"the lost run's fail() returned {fail.outcome!r} (D2)")
    _expect(list(await h.history(lost_id)) == recorded, "the lost run's end recorded a change")
    await _expect_status(h, lost_id, "leased", "the new holder keeps its lease")
    _expect(
        await h.summary_state(session_key_for(held)) == "pending",
        "the lost run's summary is not pending (D4)",
    )
    await h.summaries.write(session_key_for(new), _summary(new))
    done = await other.complete(new.id, new.lease_id, _result(new))
    _expect(done == ACCEPTED, f"the new holder's complete() returned {done!r}")
    await _expect_status(h, lost_id, "completed", "the new holder completes the task")

"""Issue 8 scenario 4: poison tasks end after exactly the configured attempts while healthy work
keeps flowing; a plain non-zero exit fails at once (ADR-0071 D4).

The poison: a task that ends its worker process (``os._exit`` and a SIGKILL of itself), an async
and a synchronous python task and a command that hang past their deadline, and a memory bomb
under ``RLIMIT_AS`` (``command`` with ``memory_limit_mb``). Workers run one task at a time under
a supervisor that starts again whatever died, so a worker killed by poison takes nothing healthy
with it. At the end every worker drains on SIGTERM and exits 0 -- also one whose synchronous
task is still blocked in its thread (found here: it never exited).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pytest

import taskward
from taskward.settings import set_max_attempts
from taskward.store.port import StateDB
from tests.faults.support import (
    PYTHON,
    all_terminal,
    fault_worker_argv,
    settle_and_check,
    submit,
    submit_many,
    supervised,
)
from tests.worker_procs import wait_until

pytestmark = pytest.mark.slow

HANG_DEADLINE_S = 0.5
MEMORY_BOMB = [PYTHON, "-c", "x = bytearray(1 << 34)"]  # 16 GiB against a 256 MiB limit


@dataclass(frozen=True)
class Poison:
    ceiling: int
    healthy: int
    workers: int
    copies: int  # of each poison task
    timeout_s: float


SHORT = Poison(ceiling=3, healthy=150, workers=3, copies=1, timeout_s=90)
LONG = Poison(ceiling=5, healthy=3000, workers=4, copies=4, timeout_s=900)


def _chain(retry: str, last: tuple[str, str], attempts: int) -> list[tuple[str, str]]:
    """``attempts`` claims: a retry after each but the last, which ends in ``last``."""
    chain: list[tuple[str, str]] = []
    for attempt in range(1, attempts + 1):
        chain.append(("running", "claimed"))
        if attempt < attempts:
            chain += [("retry_wait", retry), ("queued", "retry_ready")]
    return [*chain, last]


@pytest.mark.parametrize(
    "size",
    [pytest.param(SHORT, id="short"), pytest.param(LONG, id="long", marks=[pytest.mark.chaos])],
)
async def test_poison_ends_after_exactly_the_configured_attempts_while_healthy_work_flows(
    db: StateDB, db_url: str, tmp_path: Path, size: Poison
) -> None:
    await set_max_attempts(db, size.ceiling)
    hang = {"timeout_s": HANG_DEADLINE_S}
    poison: dict[str, list[str]] = {
        "crash_exit": [await submit(db, "crash_worker", {"how": "exit"})],
        "crash_sigkill": [await submit(db, "crash_worker", {"how": "sigkill"})],
        "hang_python": [await submit(db, "hang", hang)],
        "hang_thread": [await submit(db, "hang_in_thread", hang)],
        "hang_command": [await submit(db, "command", {"argv": ["sleep", "60"], **hang})],
        "memory_bomb": [await submit(db, "command", {"argv": MEMORY_BOMB, "memory_limit_mb": 256})],
        "exit_3": [await submit(db, "command", {"argv": [PYTHON, "-c", "raise SystemExit(3)"]})],
    }
    for _ in range(size.copies - 1):
        poison["crash_exit"].append(await submit(db, "crash_worker", {"how": "exit"}))
        poison["hang_python"].append(await submit(db, "hang", hang))
        poison["memory_bomb"].append(
            await submit(db, "command", {"argv": MEMORY_BOMB, "memory_limit_mb": 256})
        )
    healthy = await submit_many(db, "noop", size.healthy)

    argvs = [fault_worker_argv(db_url, "--concurrency", "1") for _ in range(size.workers)]
    began = time.monotonic()
    with supervised(argvs, tmp_path / "logs") as supervisor:

        async def done() -> bool:
            supervisor.restart_dead()  # the supervisor: start again whatever poison killed
            return await all_terminal(db)

        try:
            await wait_until(done, timeout=size.timeout_s, what="every task to end")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{supervisor.logs()}") from None
        deaths = supervisor.restarts
        assert await supervisor.stop_when_serving(db) == [0] * size.workers, supervisor.logs()
    elapsed = time.monotonic() - began

    ceiling = size.ceiling
    expected = {
        "crash_exit": _chain("lease_expired", ("failed", "attempts_exhausted"), ceiling),
        "crash_sigkill": _chain("lease_expired", ("failed", "attempts_exhausted"), ceiling),
        "hang_python": _chain("deadline_exceeded", ("timed_out", "attempt_ceiling"), ceiling),
        "hang_thread": _chain("deadline_exceeded", ("timed_out", "attempt_ceiling"), ceiling),
        "hang_command": _chain("deadline_exceeded", ("timed_out", "attempt_ceiling"), ceiling),
        "memory_bomb": _chain("retryable_failure", ("failed", "attempt_ceiling"), ceiling),
        "exit_3": _chain("-", ("failed", "execution_failed"), 1),
    }
    last_poison_end = 0.0
    for name, ids in poison.items():
        for task_id in ids:
            facts = await taskward.list_transitions(db, task_id)
            assert [(f["status"], f["reason_code"]) for f in facts] == expected[name], name
            row = await taskward.get_task(db, task_id)
            assert row["lease_attempts"] == (1 if name == "exit_3" else ceiling), name
            last_poison_end = max(last_poison_end, facts[-1]["created_at"])
    # every worker death was poison's, one per claim of a worker-killing task
    killers = len(poison["crash_exit"]) + len(poison["crash_sigkill"])
    assert deaths == killers * ceiling, supervisor.logs()

    # healthy work: each ran once and completed, and kept completing while poison was retried
    finished = []
    for task_id in healthy.values():
        facts = await taskward.list_transitions(db, task_id)
        assert [f["status"] for f in facts] == ["running", "completed"], task_id
        finished.append(facts[-1]["created_at"])
    assert sum(t < last_poison_end for t in finished) >= len(finished) // 2, (
        "healthy work waited for the poison to end"
    )
    await settle_and_check(db, acknowledged=healthy)
    print(
        f"\n{db.dialect}: {sum(map(len, poison.values()))} poison tasks, ceiling {ceiling}, "
        f"{deaths} worker deaths, {len(healthy)} healthy tasks, {elapsed:.1f}s"
    )

"""``taskward worker --metrics-port``: a real worker process serves its own metrics, scraped
over HTTP after it ran tasks and parsed by ``prometheus_client.parser``, on both backends."""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import time
import uuid

import httpx
import pytest

import taskward
from taskward.adapters import AdapterConfig, build_registry
from taskward.store.port import StateDB
from tests.scrape import Samples, parse, value
from tests.worker_procs import wait_until, worker_argv, workers

MODULE = "tests.integration.worker_tasks"
REGISTRY = build_registry(AdapterConfig(imports=(MODULE,)))


async def submit(db: StateDB, kind: str, **fields: object) -> str:
    app = taskward.TaskApplication(
        action_kind=kind,
        args={},
        execution_target="host",
        idempotency_key=f"k-{uuid.uuid4()}",
        **fields,  # type: ignore[arg-type]
    )
    return await taskward.submit_task(db, app, registry=REGISTRY)


async def metrics_url(proc: subprocess.Popen[str]) -> str:
    """The URL the worker says it serves its metrics on (its stderr's start-up lines)."""
    assert proc.stderr is not None
    deadline = time.monotonic() + 60
    seen = []
    while time.monotonic() < deadline:
        line = await asyncio.to_thread(proc.stderr.readline)
        if not line:
            break
        seen.append(line)
        match = re.search(r"metrics on (http://\S+/metrics)", line)
        if match:
            return match.group(1)
    raise AssertionError(f"no metrics line: {seen}")


async def scrape_until(url: str, done: int, *, timeout: float = 60) -> Samples:
    """Scrape until the worker counted ``done`` task ends (a commit is visible in the store a
    moment before the worker's counter moves)."""
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=10) as http:
        while True:
            r = await http.get(url)
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/plain")
            samples, types = parse(r.text)
            assert types["taskward_task_run_seconds"] == "histogram"
            ended = sum(
                v for (name, _), v in samples.items() if name == "taskward_task_completions_total"
            )
            if ended >= done or time.monotonic() > deadline:
                return samples
            await asyncio.sleep(0.05)


@pytest.mark.slow
async def test_a_worker_serves_its_counters_and_histograms_by_kind_and_status(
    db: StateDB, db_url: str
) -> None:
    for _ in range(3):
        await submit(db, "noop")
    for _ in range(2):
        await submit(db, "boom", max_attempts=1)
    # Fails retryably once (retry_wait), then at its ceiling: failed.
    await submit(db, "flaky", max_attempts=2)
    argv = worker_argv(db_url, "--concurrency", "4", "--metrics-port", "0")
    with workers([argv]) as [proc]:
        url = await metrics_url(proc)

        async def all_ended() -> bool:
            counts = await taskward.reads.count_by_status(db)
            return counts["completed"] == 3 and counts["failed"] == 3

        await wait_until(all_ended, timeout=60, what="six tasks ended")
        samples = await scrape_until(url, 6)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    counter = "taskward_task_completions_total"
    assert value(samples, counter, kind="noop", status="completed") == 3
    assert value(samples, counter, kind="boom", status="failed") == 2
    assert value(samples, counter, kind="flaky", status="failed") == 1
    assert value(samples, "taskward_task_claims_total", kind="noop") == 3
    assert value(samples, "taskward_task_claims_total", kind="flaky") == 2
    retries = "taskward_task_retries_scheduled_total"
    assert value(samples, retries, kind="flaky", cause="failure") == 1
    run = "taskward_task_run_seconds"
    assert value(samples, f"{run}_count", kind="noop", status="completed") == 3
    assert value(samples, f"{run}_count", kind="flaky", status="retry_wait") == 1
    assert value(samples, f"{run}_bucket", kind="noop", status="completed", le="+Inf") == 3
    wait = "taskward_task_queue_wait_seconds"
    assert value(samples, f"{wait}_count", kind="noop") == 3
    assert value(samples, f"{wait}_count", kind="boom") == 2
    # The store's queue depth, read on the worker's loop at the scrape.
    assert value(samples, "taskward_queue_depth", status="completed") == 3
    assert value(samples, "taskward_queue_depth", status="failed") == 3
    # This worker admitted nothing.
    assert not any(name == "taskward_task_admissions_total" for name, _ in samples)


def test_a_metrics_port_in_use_is_refused_by_name(db_url: str) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            worker_argv(db_url, "--burst", "--metrics-port", str(port)),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode != 0
    assert f"--metrics-port {port} on 127.0.0.1" in done.stderr
    assert "Traceback" not in done.stderr


def free_port_pair() -> int:
    """A port P with P and P+1 free now (bound and released; a clash later fails the test)."""
    import socket

    for _ in range(50):
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            if port >= 65535:
                continue
            with socket.socket() as second:
                try:
                    second.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
                return int(port)
    raise AssertionError("no two consecutive free ports")


@pytest.mark.slow
async def test_each_supervised_child_serves_its_own_port(db: StateDB, db_url: str) -> None:
    for _ in range(4):
        await submit(db, "noop")
    port = free_port_pair()
    argv = worker_argv(db_url, "--processes", "2", "--metrics-port", str(port))
    with workers([argv]) as [proc]:

        async def done() -> bool:
            return (await taskward.reads.count_by_status(db))["completed"] == 4

        await wait_until(done, timeout=60, what="four completions")
        claims = 0.0
        async with httpx.AsyncClient(timeout=10) as http:
            for child_port in (port, port + 1):
                deadline = time.monotonic() + 60
                while True:  # a child listens once it started: wait for it
                    try:
                        r = await http.get(f"http://127.0.0.1:{child_port}/metrics")
                        break
                    except httpx.TransportError:
                        assert time.monotonic() < deadline, f"nothing on {child_port}"
                        await asyncio.sleep(0.1)
                samples, _ = parse(r.text)
                assert value(samples, "taskward_queue_depth", status="completed") is not None
                claims += value(samples, "taskward_task_claims_total", kind="noop") or 0.0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    assert claims == 4  # each child counted its own claims; together, every task once

"""``TaskMetrics``: plain numbers on the hot path, prometheus-client's families at a scrape."""

from __future__ import annotations

from prometheus_client import generate_latest
from pytest import approx

from taskward.metrics import QUEUE_WAIT_BUCKETS_S, RUN_BUCKETS_S, TaskMetrics
from tests.scrape import parse, value


def test_histogram_buckets_are_inclusive_cumulative_and_end_at_inf() -> None:
    m = TaskMetrics()
    for wait in (0.0, 0.005, 0.0051, 7200.0, -1.0):  # a negative wait (clock skew) counts as 0
        m.claimed("noop", wait)
    samples, types = parse(generate_latest(m.registry).decode())
    assert types["taskward_task_queue_wait_seconds"] == "histogram"
    name = "taskward_task_queue_wait_seconds_bucket"
    assert value(samples, name, kind="noop", le="0.005") == 3  # 0, 0.005 (le is <=), -1 -> 0
    assert value(samples, name, kind="noop", le="0.01") == 4
    assert value(samples, name, kind="noop", le="3600.0") == 4
    assert value(samples, name, kind="noop", le="+Inf") == 5
    assert value(samples, "taskward_task_queue_wait_seconds_count", kind="noop") == 5
    assert value(samples, "taskward_task_queue_wait_seconds_sum", kind="noop") == approx(7200.0101)
    assert value(samples, "taskward_task_claims_total", kind="noop") == 5
    buckets = [le for (n, labels) in samples for k, le in labels if n == name and k == "le"]
    assert len(buckets) == len(QUEUE_WAIT_BUCKETS_S) + 1


def test_an_end_counts_by_status_and_a_retry_is_not_a_completion() -> None:
    m = TaskMetrics()
    m.ended("flaky", "retry_wait", 0.2)
    m.ended("flaky", "failed", 0.3)
    m.ended("noop", "completed", None)  # a lease this process did not claim: no run time
    samples, _ = parse(generate_latest(m.registry).decode())
    completions = "taskward_task_completions_total"
    assert value(samples, completions, kind="flaky", status="failed") == 1
    assert value(samples, completions, kind="flaky", status="retry_wait") is None
    assert value(samples, completions, kind="noop", status="completed") == 1
    retries = "taskward_task_retries_scheduled_total"
    assert value(samples, retries, kind="flaky", cause="failure") == 1
    run = "taskward_task_run_seconds_count"
    assert value(samples, run, kind="flaky", status="retry_wait") == 1
    assert value(samples, run, kind="noop", status="completed") is None
    assert len(RUN_BUCKETS_S) == 15


def test_registries_are_per_instance() -> None:
    first, second = TaskMetrics(), TaskMetrics()
    first.admitted("command", created=True)
    first.outbox_outcomes({"delivered": 2, "claimed": 2, "released": 1})
    first.http_admission("rejected")
    get = first.registry.get_sample_value
    assert get("taskward_task_admissions_total", {"kind": "command", "outcome": "new"}) == 1
    assert get("taskward_outbox_deliveries_total", {"outcome": "delivered"}) == 2
    assert get("taskward_outbox_deliveries_total", {"outcome": "claimed"}) is None
    assert get("taskward_http_admissions_total", {"outcome": "rejected"}) == 1
    assert (
        second.registry.get_sample_value(
            "taskward_task_admissions_total", {"kind": "command", "outcome": "new"}
        )
        is None
    )

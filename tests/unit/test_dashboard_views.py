"""The dashboard's pure view models (issue 28): charts, the list's rows and flash, the task
page's output, evidence and claim fields, the overview's counts of what is in use."""

from __future__ import annotations

from typing import Any

from taskward.dashboard import chartviews, listviews, overviewviews, taskviews
from taskward.dashboard.views import fmt_ago, fmt_duration

EDGES = [1_000_000.0 + 60 * i for i in range(6)]


def test_bars_stack_by_series_and_draw_no_zero() -> None:
    chart = chartviews.bar_chart(
        "ended",
        EDGES,
        60,
        [
            ("completed", "c-completed", [0, 3, 0, 1, 0, 0]),
            ("failed", "c-failed", [0, 1, 0, 0, 0, 0]),
        ],
        unit="in the last 1h",
    )
    values = [(b["cls"], b["value"]) for b in chart["bars"]]
    assert values == [("c-completed", "3"), ("c-failed", "1"), ("c-completed", "1")]
    completed, failed = chart["bars"][0], chart["bars"][1]
    assert failed["y"] + failed["h"] == completed["y"]  # stacked on top
    frame = chart["frame"]
    assert completed["y"] + completed["h"] == frame["bottom"]
    assert [t["label"] for t in frame["y_ticks"]] == ["0", "1", "2", "3", "4"]
    assert chart["summary"] == "4 completed, 1 failed (in the last 1h)"
    assert not chart["empty"]
    empty = chartviews.bar_chart("x", EDGES, 60, [("completed", "c", [0] * 6)], unit="")
    assert empty["empty"] and empty["bars"] == []


def test_lines_break_at_a_missing_value_and_a_lone_value_is_a_dot() -> None:
    chart = chartviews.line_chart(
        "p95",
        EDGES,
        60,
        [("p95", "c-p95", [0.5, 1.0, None, 2.5, None, None])],
        fmt=chartviews.fmt_seconds,
    )
    [line] = chart["lines"]
    assert line["d"].count("M") == 2 and line["d"].count("L") == 1
    assert [d["value"] for d in line["dots"]] == ["2.5 s"]
    assert line["max"] == "2.5 s" and line["nonzero"]
    ticks = [t["label"] for t in chart["frame"]["y_ticks"]]
    assert ticks == ["0 ms", "1 s", "2 s", "3 s", "4 s"]  # four round steps


def test_nice_ceilings_and_unit_words() -> None:
    assert [chartviews.nice_ceiling(v) for v in (0, 0.3, 1, 3, 7, 12, 2600)] == [
        1.0,
        0.5,
        1.0,
        5.0,
        10.0,
        20.0,
        5000.0,
    ]
    assert [chartviews.count_ceiling(v) for v in (0, 3, 5, 9, 100)] == [4, 4, 8, 12, 100]
    assert chartviews.fmt_seconds(0.25) == "250 ms"
    assert chartviews.fmt_seconds(300) == "5 min"
    assert fmt_ago(3) == "just now" and fmt_ago(185) == "3 min ago" and fmt_ago(7300) == "2 h ago"
    assert fmt_duration(0.42) == "0.42 s" and fmt_duration(245) == "4 min 05 s"


def test_counts_show_only_the_statuses_and_targets_in_use() -> None:
    pairs = [
        {"status": "queued", "execution_target": "host", "n": 2},
        {"status": "completed", "execution_target": "host", "n": 5},
        {"status": "completed", "execution_target": "daytona", "n": 0},
    ]
    region = overviewviews.counts_region(pairs)
    assert region["columns"] == ["status", "host", "total"]
    assert [r[0]["text"] for r in region["rows"]] == ["queued", "completed", "all"]
    assert overviewviews.counts_region([])["rows"] == []


def test_the_flash_of_a_bulk_action_is_one_of_its_texts() -> None:
    assert listviews.flash_text({"done": "retried", "n": "2", "of": "3"}) == (
        "retried 2 of 3 selected tasks: each runs again as a new task"
    )
    assert listviews.flash_text({"done": "retried", "n": "<b>", "of": "3"}) is None
    assert listviews.flash_text({"done": "anything"}) is None


def _failed(**changes: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": "01a2-aaaa-bbbb-cccc-0123456789ab",
        "status": "failed",
        "action_kind": "command",
        "created_at": 1_000.0,
        "ended_at": 1_010.0,
        "lease_attempts": 1,
        "max_attempts": 1,
        "leased_by": "host:w1",
        "lease_expires_at": 1_100.0,
        "deadline_at": 1_200.0,
        "status_reason_code": "execution_failed",
        "status_reason_summary": "exit code 3\nline 1\nline 2",
        "error_detail": "exit code 3\nline 1\nline 2",
        "status_evidence_refs": [
            {
                "kind": "process",
                "pid": 7,
                "started_at": 1_002.0,
                "duration_s": 8.0,
                "output_tail": "line 1\nline 2\n",
                "output_truncated": False,
            }
        ],
    }
    row.update(changes)
    return row


FACTS = [
    {
        "status": "running",
        "previous_status": "queued",
        "created_at": 1_002.0,
        "reason_code": "claimed",
        "reason_summary": "attempt 1",
    },
    {
        "status": "failed",
        "previous_status": "running",
        "created_at": 1_010.0,
        "reason_code": "execution_failed",
        "reason_summary": "exit code 3\nline 1\nline 2",
    },
]


def test_a_failed_task_shows_its_output_once_and_no_claim() -> None:
    regions = taskviews.task_regions(_failed(), None, FACTS, [], now=2_000.0)
    assert regions["output"]["text"] == "line 1\nline 2"
    assert regions["output-section"]["visible"]
    fields = {i["key"]: i for i in regions["fields"]["items"]}
    assert fields["reason"]["text"] == "execution_failed: exit code 3"
    assert fields["error"]["text"] == "exit code 3"
    assert fields["ran"]["text"] == "8.00 s"
    assert fields["started"]["text"] == "1970-01-01 00:16:42 UTC"
    assert fields["created"]["iso"] == "1970-01-01T00:16:40+00:00"
    assert not {"leased_by", "lease_expires", "deadline"} & set(fields)
    timeline = [i["detail"] for i in regions["timeline"]["items"]]
    assert timeline[-1] == "execution_failed: exit code 3"
    evidence = {i["label"]: i["text"] for i in regions["evidence"]["items"]}
    assert evidence["started at"] == "1970-01-01 00:16:42 UTC"
    assert evidence["ran"] == "8.00 s" and evidence["output cut"] == "no"
    assert "output_tail" not in str(regions["evidence"])


def test_a_running_task_shows_who_holds_it_and_until_when() -> None:
    row = _failed(status="running", ended_at=None, status_evidence_refs=None, error_detail=None)
    regions = taskviews.task_regions(row, None, FACTS[:1], [], now=1_050.0)
    fields = {i["key"]: i["text"] for i in regions["fields"]["items"]}
    assert fields["leased_by"] == "host:w1"
    assert fields["lease_expires"].endswith("(in 50.0 s)")
    assert fields["ran"] == "48.0 s so far"
    assert not regions["output-section"]["visible"]


def test_a_traceback_is_the_output_when_there_is_no_tail() -> None:
    row = _failed(status_evidence_refs=[], error_detail="ValueError: bad\nTraceback...\n  line")
    assert taskviews.output_text(row) == "ValueError: bad\nTraceback...\n  line"
    assert taskviews.output_text(_failed(status_evidence_refs=[], error_detail="one")) == ""

"""``taskward worker --idle-wait``: how long an idle worker waits when nothing wakes it
(docs/worker.md, Running a worker; docs/deployment.md)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from taskward.cli.main import main


def test_the_idle_wait_paces_a_burst_workers_idle_check(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'tw.db'}"
    began = time.monotonic()
    assert main(["--db", url, "worker", "--burst", "--quiet", "--idle-wait", "1.5"]) == 0
    # --burst exits at its first idle check, one idle wait after the start (0.5 s by default)
    assert time.monotonic() - began >= 1.5


@pytest.mark.parametrize("value", ["0.01", "3601", "soon"])
def test_an_idle_wait_out_of_range_is_refused_naming_the_option(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["worker", "--idle-wait", value]) == 2
    err = capsys.readouterr().err
    assert "--idle-wait" in err and "Traceback" not in err

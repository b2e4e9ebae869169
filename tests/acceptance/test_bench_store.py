"""``bench/store.py``: the measurement ``taskward bench`` made, as a script of ``bench/``.

Run as a user runs it: a subprocess against a real store, on both backends (``db_url``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from taskward.cli.errors import EXIT_OK

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "store.py"


def test_bench_store_measures_the_store_and_checks_every_task_it_wrote(
    db_url: str, tmp_path: Path
) -> None:
    """``bench/store.py --json``: admission one per call and in bulk, a drain by a real worker
    process and pickup latency, then the check of every task the run created (issue 7): all
    terminal, exactly 2 facts, 2 events and 1 summary each, no violation."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKWARD_")}
    argv = ["--db", db_url, "--count", "30", "--bulk-count", "40", "--pickup-count", "5", "--json"]
    run = subprocess.run(
        [sys.executable, str(SCRIPT), *argv],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert run.returncode == EXIT_OK, run.stderr
    out = json.loads(run.stdout)
    for key in ("admission_per_s", "bulk_admission_per_s", "drain_per_s"):
        assert out[key] > 0, key
    assert 0 < out["pickup_p50_ms"] <= out["pickup_p95_ms"] <= out["pickup_p99_ms"]
    assert out["drain_concurrency"] == 128  # the documented default
    assert out["tasks"] == 30 + 40 + 5
    assert out["violation_count"] == 0 and out["violations"] == []
    assert out["rows_per_task"]["facts"] == 2.0 and out["rows_per_task"]["events"] == 2.0
    assert out["rows_per_task"]["summaries"] == 1.0


def test_taskward_bench_is_no_longer_a_command(db_url: str, tmp_path: Path) -> None:
    """The CLI's ``bench`` is gone (bench code is out of ``src/``): click's usage error."""
    run = subprocess.run(
        [sys.executable, "-m", "taskward.cli.main", "--db", db_url, "bench"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert run.returncode == 2
    assert "No such command 'bench'" in run.stderr

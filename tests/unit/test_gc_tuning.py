"""The long-running CLI processes tune the cyclic garbage collector (cli.common.tune_gc):
start-up's objects frozen out of its view, a first threshold of 10,000. Checked in a child
interpreter, so this test process keeps CPython's defaults."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import gc, json
before = {"threshold": gc.get_threshold(), "frozen": gc.get_freeze_count()}
from taskward.cli.common import GC_FIRST_THRESHOLD, tune_gc
tune_gc()
print(json.dumps({"before": before, "threshold": gc.get_threshold(),
                  "frozen": gc.get_freeze_count(), "first": GC_FIRST_THRESHOLD}))
"""


def test_tune_gc_freezes_start_up_and_raises_only_the_first_threshold() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    seen = json.loads(out)
    default_first, second, third = seen["before"]["threshold"]
    assert seen["before"]["frozen"] == 0
    assert seen["threshold"] == [seen["first"], second, third] and seen["first"] > default_first
    assert seen["frozen"] > 10_000  # the imports' objects: taskward, pydantic, click, asyncio

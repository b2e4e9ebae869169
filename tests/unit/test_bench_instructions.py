"""bench/instructions.py without valgrind: its arguments, the callgrind file reader, the
per-layer budget and report, and a child run natively (its client requests are no-ops there)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
from bench import instructions

SCRIPT = Path(instructions.__file__)

# A callgrind file as callgrind 3.19 writes one: compressed names shared by ob= and cob=, a
# call's inclusive cost on the line after calls= (not self cost), relative positions.
CALLGRIND_OUT = """\
# callgrind format
version: 1
creator: callgrind-3.19.0
positions: line
events: Ir
summary: 0

ob=(1) /usr/lib/libpython3.11.so.1.0
fl=(1) ceval.c
fn=(1) _PyEval_EvalFrameDefault
10 100
+2 50
cob=(2) /usr/lib/x86_64-linux-gnu/libsqlite3.so.0.8.6
cfi=(2) ???
cfn=(2) sqlite3_step
calls=3 0
* 70

ob=(2)
fl=(2)
fn=(2)
0 70
ob=(3) /usr/lib/x86_64-linux-gnu/libc.so.6
fl=(3) memset.S
fn=(3) memset
0 5

totals: 225
"""


def test_read_callgrind_counts_self_cost_by_object(tmp_path: Path) -> None:
    path = tmp_path / "callgrind.out"
    path.write_text(CALLGRIND_OUT)
    total, by_object = instructions.read_callgrind(path)
    assert total == 225
    assert by_object == {
        "libpython3.11.so.1.0": 150,
        "libsqlite3.so.0.8.6": 70,
        "libc.so.6": 5,
    }


def test_read_callgrind_refuses_a_file_whose_costs_do_not_add_up(tmp_path: Path) -> None:
    path = tmp_path / "callgrind.out"
    path.write_text(CALLGRIND_OUT.replace("totals: 225", "totals: 226"))
    with pytest.raises(ValueError, match="add up to 225"):
        instructions.read_callgrind(path)


def test_arguments_defaults_and_bounds(capsys: pytest.CaptureFixture[str]) -> None:
    args = instructions.parse_args([])
    assert (args.backend, args.count, args.concurrency, args.repeat) == ("sqlite", 2000, 128, 2)
    assert args.layers == ["drain", "host", "adapter", "sql"]
    assert instructions.parse_args(["--layers", "drain, host"]).layers == ["drain", "host"]
    for bad in (["--layers", "drain,floor"], ["--count", "0"], ["--nice", "20"]):
        with pytest.raises(SystemExit):
            instructions.parse_args(bad)
    assert "allowed: drain, host, adapter, sql" in capsys.readouterr().err


def test_children_run_under_nice_and_callgrind_with_instrumentation_off(tmp_path: Path) -> None:
    argv = instructions.valgrind_argv(tmp_path / "out", ["--child", "host"], nice=10)
    assert argv[:4] == ["nice", "-n", "10", "valgrind"]
    assert "--tool=callgrind" in argv and "--instr-atstart=no" in argv
    assert argv[-2:] == ["--child", "host"]
    assert instructions.valgrind_argv(tmp_path / "out", [], nice=0)[0] == "valgrind"


def test_report_gives_the_budget_the_spread_and_the_cost_by_object() -> None:
    args = argparse.Namespace(backend="sqlite", count=10, concurrency=4, otel="none")

    def run(total: int, sqlite: int = 0, **extra: object) -> dict[str, object]:
        by_object = {"libpython": total - sqlite, "libsqlite3": sqlite}
        return {"total": total, "by_object": by_object, "violations": [],
                "taskward": "/nowhere", **extra}  # fmt: skip

    repeats = [
        {"drain": run(1000, 400, batches=3), "host": run(200), "adapter": run(100),
         "sql": run(300, 250)},
        {"drain": run(1010, 400, batches=4), "host": run(200), "adapter": run(100),
         "sql": run(300, 250)},
    ]  # fmt: skip
    report = instructions.make_report(args, ["drain", "host", "adapter", "sql"], repeats)
    assert report["instructions_per_task"]["taskward"] == 40  # median of 40 and 41, rounded
    assert report["repeats"] == [
        {"drain": 100, "host": 20, "adapter": 10, "sql": 30, "taskward": 40},
        {"drain": 101, "host": 20, "adapter": 10, "sql": 30, "taskward": 41},
    ]
    assert report["spread_pct"] == {"drain": 1.0, "host": 0.0, "adapter": 0.0, "sql": 0.0}
    assert report["by_object_per_task"] == [
        {"object": "libpython", "drain": 60, "host": 20, "adapter": 10, "sql": 5},
        {"object": "libsqlite3", "drain": 40, "host": 0, "adapter": 0, "sql": 25},
    ]
    assert [c["drain"] for c in report["children"]] == [{"batches": 3}, {"batches": 4}]
    assert report["violations"] == []
    text = instructions.render_report(report)
    assert "taskward" in text and "libsqlite3" in text and "1.000 %" in text


def test_a_child_refuses_to_run_outside_valgrind() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--child", "host", "--count", "5"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "under valgrind" in done.stderr


@pytest.mark.parametrize("layer", ["host", "sql"])
def test_a_child_run_natively_measures_and_checks_its_layer(layer: str) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--child", layer, "--native", "--count", "30"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["violations"] == []
    assert Path(result["taskward"]).name == "taskward"

"""Mutants (issue 8): three deliberately broken behaviours, each caught by the named tests that
should catch it, and those tests pass without it.

Each mutant is a test-only pytest plugin (``tests/mutants/plugin_<name>.py``) that patches
taskward when it is imported; it is loaded with ``-p`` into a pytest subprocess that runs only
the named tests (SQLite cases: the behaviour is the same on both backends). Nothing of the
mutants is in ``src/``. The runs go side by side, each with its own ``--basetemp``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
TIMEOUT_S = 240

WORKER = "tests/integration/test_worker.py"
CHECKER = "tests/integration/test_checker.py"
CONFORMANCE = "tests/conformance/test_host_conformance.py::test_local_ports_pass_conformance_case"
MODEL = "tests/model/test_stateful.py"

CATCHERS: dict[str, list[str]] = {
    # (a) terminal writes without their lease guard: a stale owner overwrites a reclaimed row
    "unguarded_terminal_write": [
        f"{WORKER}::test_a_reclaimed_rows_stale_owner_loses_and_its_result_is_only_evidence[sqlite]",
        f"{CONFORMANCE}[sqlite-stale_lease_rejected_after_reclaim]",
        f"{CHECKER}::test_a_stale_owner_after_reclaim_keeps_every_invariant[sqlite]",
        f"{MODEL}::test_a_scripted_history_behaves_like_its_model"
        "[sqlite-a_reclaimed_rows_stale_worker_is_refused_then_replayed]",
        f"{MODEL}::test_the_queue_behaves_like_its_model[sqlite]",
    ],
    # (b) the reaper ignores the attempt ceiling: a lease lapsing on the last attempt requeues
    "reaper_ignores_ceiling": [
        f"{WORKER}::test_attempts_exhausted_by_expiry_fail_at_the_stored_ceiling[sqlite]",
        f"{CONFORMANCE}[sqlite-attempt_ceiling_dead_letters_poison_work]",
        f"{CHECKER}::test_expiry_at_the_ceiling_keeps_every_invariant[sqlite]",
        f"{MODEL}::test_a_scripted_history_behaves_like_its_model"
        "[sqlite-expiry_on_every_attempt_fails_at_the_ceiling]",
        f"{MODEL}::test_the_queue_behaves_like_its_model[sqlite]",
    ],
    # (c) the host acknowledges completion before the run and its summary
    "ack_before_run": [
        f"{CONFORMANCE}[sqlite-summary_written_before_complete]",
        f"{CHECKER}::test_a_resident_host_workload_keeps_every_invariant[sqlite]",
    ],
}

_OUTCOME = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (\S+)")


def _pytest(tests: list[str], basetemp: Path, *, plugin: str | None) -> subprocess.Popen[str]:
    env = dict(os.environ)
    # under a mutant the model test stops at its first failure instead of shrinking it
    env["TASKWARD_MODEL_PROFILE"] = "taskward-model-mutant" if plugin else "taskward-model"
    # only the plugins these tests use: autoloading every installed one costs seconds per run
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    argv = [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider"]
    argv += ["-p", "pytest_asyncio.plugin", "-p", "pytest_timeout"]
    if plugin:
        argv += ["-p", f"tests.mutants.plugin_{plugin}"]
    argv += [f"--basetemp={basetemp}", *tests]
    return subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _outcomes(output: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in output.splitlines():
        match = _OUTCOME.match(line)
        if match:
            found[match.group(2)] = match.group(1)
    return found


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    """Outcome of every named test: without mutants ("baseline") and under each mutant."""
    runs: dict[str, tuple[str | None, list[str]]] = {
        "baseline": (None, sorted({t for tests in CATCHERS.values() for t in tests})),
        **{name: (name, tests) for name, tests in CATCHERS.items()},
    }
    procs = {
        name: _pytest(tests, tmp_path_factory.mktemp(name), plugin=plugin)
        for name, (plugin, tests) in runs.items()
    }
    results: dict[str, dict[str, str]] = {}
    try:
        for name, proc in procs.items():
            output, _ = proc.communicate(timeout=TIMEOUT_S)
            results[name] = _outcomes(output)
            results[name]["<output>"] = output[-4000:]
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return results


def test_the_named_catchers_pass_without_any_mutant(outcomes: dict[str, dict[str, str]]) -> None:
    baseline = outcomes["baseline"]
    expected = {t for tests in CATCHERS.values() for t in tests}
    assert {t: baseline.get(t) for t in expected} == dict.fromkeys(expected, "PASSED"), baseline[
        "<output>"
    ]


@pytest.mark.parametrize("mutant", sorted(CATCHERS))
def test_each_mutant_fails_every_test_named_to_catch_it(
    outcomes: dict[str, dict[str, str]], mutant: str
) -> None:
    seen = outcomes[mutant]
    caught = {t: seen.get(t) for t in CATCHERS[mutant]}
    assert caught == dict.fromkeys(CATCHERS[mutant], "FAILED"), seen["<output>"]


def test_no_mutant_lives_in_the_shipped_code() -> None:
    mention = re.compile(r"\bmutants?\b|tests\.mutants", re.IGNORECASE)
    shipped = [p for p in (ROOT / "src" / "taskward").rglob("*") if p.suffix in {".py", ".sql"}]
    assert shipped and [p for p in shipped if mention.search(p.read_text())] == []

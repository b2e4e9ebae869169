"""The supervisor's pure parts (R26): the restart backoff, the children's worker ids and argv,
``--processes`` and the command line a child is given (the real processes: tests/concurrency/
test_worker_supervisor.py)."""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from taskward.cli import worker_cmd
from taskward.cli.main import main
from taskward.store.open import ENV_VAR
from taskward.supervisor import (
    MAX_PROCESSES,
    RestartBackoff,
    Supervisor,
    WorkerIds,
    child_argv,
    describe_exit,
    metrics_port_of,
    resolve_processes,
)


def test_a_crash_restarts_after_half_a_second_doubling_to_thirty() -> None:
    backoff = RestartBackoff()
    delays = [backoff.delay_after(1, ran_s=0.1) for _ in range(9)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]


def test_death_by_a_signal_is_a_crash() -> None:
    backoff = RestartBackoff()
    assert backoff.delay_after(-signal.SIGKILL, ran_s=0.1) == 0.5
    assert backoff.delay_after(-signal.SIGSEGV, ran_s=0.1) == 1.0


def test_a_healthy_run_resets_the_backoff() -> None:
    backoff = RestartBackoff(initial_s=0.5, healthy_after_s=10.0)
    for _ in range(5):
        backoff.delay_after(1, ran_s=1.0)
    assert backoff.delay_after(1, ran_s=9.9) == 16.0
    assert backoff.delay_after(1, ran_s=10.0) == 0.5
    assert backoff.delay_after(1, ran_s=0.0) == 1.0


def test_exit_75_restarts_at_once_and_is_not_a_crash() -> None:
    backoff = RestartBackoff()
    assert backoff.delay_after(1, ran_s=0.1) == 0.5
    assert backoff.delay_after(75, ran_s=0.1) == 0.0
    assert backoff.delay_after(75, ran_s=0.1) == 0.0
    assert backoff.delay_after(1, ran_s=0.1) == 1.0  # 75 did not advance it


def test_exit_0_is_never_restarted() -> None:
    assert RestartBackoff().delay_after(0, ran_s=0.1) is None
    assert RestartBackoff().delay_after(0, ran_s=100.0) is None


def test_a_given_worker_id_is_a_prefix_counted_over_every_start() -> None:
    ids = WorkerIds("w")
    assert [ids.next() for _ in range(4)] == ["w-1", "w-2", "w-3", "w-4"]


def test_default_worker_ids_are_never_reused() -> None:
    made = iter(["host:aa", "host:bb", "host:aa", "host:bb", "host:cc"])
    ids = WorkerIds(make=lambda: next(made))
    assert [ids.next() for _ in range(3)] == ["host:aa", "host:bb", "host:cc"]


def test_default_worker_ids_are_host_and_8_hex() -> None:
    first, second = WorkerIds().next(), WorkerIds().next()
    assert first != second
    assert first.startswith("host:") and len(first) == len("host:") + 8


def test_a_childs_argv_is_the_base_with_its_own_worker_id() -> None:
    base = [sys.executable, "-m", "taskward.cli.main", "worker", "--burst"]
    assert child_argv(base, "w-3") == [*base, "--worker-id", "w-3"]
    assert base[-1] == "--burst"  # not mutated


def test_processes_is_1_to_the_max_or_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_processes("1") == 1
    assert resolve_processes(str(MAX_PROCESSES)) == MAX_PROCESSES
    monkeypatch.setattr("os.cpu_count", lambda: 6)
    assert resolve_processes("auto") == 6
    assert resolve_processes("AUTO") == 6
    monkeypatch.setattr("os.cpu_count", lambda: 500)
    assert resolve_processes("auto") == MAX_PROCESSES
    monkeypatch.setattr("os.cpu_count", lambda: None)
    assert resolve_processes("auto") == 1
    for bad in ("0", "-2", str(MAX_PROCESSES + 1), "two", ""):
        with pytest.raises(ValueError, match=f"1..{MAX_PROCESSES} or auto"):
            resolve_processes(bad)


def test_exits_are_described_with_their_signal_or_meaning() -> None:
    assert describe_exit(0) == "0"
    assert describe_exit(75) == "75 (memory pressure)"
    assert describe_exit(-9) == "-9 (killed by SIGKILL)"


@pytest.fixture
def supervised(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """Calls of the CLI's ``run_supervisor``, which returns 0 without starting anything."""
    calls: list[dict[str, Any]] = []

    def fake(
        base_argv: list[str],
        processes: int,
        *,
        worker_id_prefix: str | None,
        metrics_port: int | None = None,
    ) -> int:
        calls.append(
            {
                "argv": base_argv,
                "processes": processes,
                "prefix": worker_id_prefix,
                "metrics_port": metrics_port,
            }
        )
        return 0

    monkeypatch.setattr(worker_cmd, "run_supervisor", fake)
    monkeypatch.delenv(ENV_VAR, raising=False)
    yield calls


MODULE = "tests.integration.worker_tasks"


def test_a_child_gets_the_command_line_without_processes_and_worker_id(
    supervised: list[dict[str, Any]],
) -> None:
    url = "sqlite:///x.db"
    group = ["--db", url, "--import", MODULE, "--import", "json"]
    options = ["--concurrency", "4", "--capability", "a", "--capability", "b", "--worker-id", "w"]
    more = ["--lease-ttl", "2", "--burst", "--quiet", "--memory-limit-mb", "300"]
    code = main([*group, "worker", "--processes", "3", *options, *more])
    assert code == 0
    [call] = supervised
    assert call["processes"] == 3 and call["prefix"] == "w"
    assert call["argv"] == [
        sys.executable,
        "-m",
        "taskward.cli.main",
        "--db",
        url,
        "--import",
        MODULE,
        "--import",
        "json",
        "worker",
        "--concurrency",
        "4",
        "--capability",
        "a",
        "--capability",
        "b",
        "--lease-ttl",
        "2.0",
        "--memory-limit-mb",
        "300.0",
        "--burst",
        "--quiet",
    ]


def test_each_child_serves_metrics_on_its_own_port(supervised: list[dict[str, Any]]) -> None:
    code = main(["worker", "--processes", "3", "--metrics-port", "9300", "--metrics-host", "::1"])
    assert code == 0
    [call] = supervised
    # The first port goes to the supervisor, never to a child as it is: child i gets PORT+i-1.
    assert call["metrics_port"] == 9300
    assert call["argv"][-3:] == ["worker", "--metrics-host", "::1"]
    ports = [metrics_port_of(9300, slot) for slot in (1, 2, 3)]
    assert ports == [9300, 9301, 9302]
    assert child_argv(["w"], "id-2", metrics_port=9301) == [
        "w",
        "--worker-id",
        "id-2",
        "--metrics-port",
        "9301",
    ]
    assert metrics_port_of(None, 2) is None


@pytest.mark.parametrize("port", ["0", "65535"])
def test_a_metrics_port_range_past_the_last_port_is_refused(
    supervised: list[dict[str, Any]], port: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["worker", "--processes", "2", "--metrics-port", port]) != 0
    assert supervised == []
    assert "child i serves PORT+i-1" in capsys.readouterr().err


def test_a_store_url_from_the_environment_stays_out_of_the_childs_argv(
    supervised: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_VAR, "postgresql://u:secret@db/x")
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert main(["worker", "--processes", "auto"]) == 0
    [call] = supervised
    assert call["processes"] == 2 and call["prefix"] is None
    assert call["argv"] == [sys.executable, "-m", "taskward.cli.main", "worker"]


def test_processes_1_runs_no_supervisor(
    supervised: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[object] = []

    def fake_loop(coro: Any) -> int:
        coro.close()
        ran.append(coro)
        return 0

    monkeypatch.setattr(worker_cmd, "run_worker_loop", fake_loop)
    assert main(["--db", "sqlite:///x.db", "worker", "--processes", "1"]) == 0
    assert len(ran) == 1 and supervised == []


@pytest.mark.parametrize("bad", ["0", "65", "many"])
def test_a_bad_processes_value_exits_2(supervised: list[dict[str, Any]], bad: str) -> None:
    assert main(["--db", "sqlite:///x.db", "worker", "--processes", bad]) == 2
    assert supervised == []


async def test_a_stop_before_any_start_starts_nothing_and_exits_0() -> None:
    lines: list[str] = []
    supervisor = Supervisor([sys.executable, "-c", "raise SystemExit(3)"], 3, log=lines.append)
    supervisor.request_stop(signal.SIGTERM)
    assert await supervisor.run() == 0
    assert not any("started" in line for line in lines), lines


def test_processes_are_bounded() -> None:
    for bad in (0, MAX_PROCESSES + 1):
        with pytest.raises(ValueError, match=f"1..{MAX_PROCESSES}"):
            Supervisor(["x"], bad)

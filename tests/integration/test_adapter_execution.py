"""Adapters executing for real: subprocesses, process groups, python callables, the launcher
and workflow definitions, all reached through ``build_registry`` as a worker reaches them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from taskward import (
    AdapterConfig,
    CancellationToken,
    TaskAdapterRegistry,
    TaskApplication,
    TaskExecutionResult,
    TaskValidationError,
    build_registry,
)
from taskward.adapters import LAUNCHER_KINDS, CommandAdapter
from taskward.adapters.process import OUTPUT_TAIL_BYTES
from taskward.adapters.workflow import content_hash_of

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="process groups are POSIX")

SAMPLE = "tests.fixtures.sample_tasks"
PY = sys.executable
DEADLINE_S = 10.0


async def wait_until(predicate: Callable[[], bool], timeout_s: float = DEADLINE_S) -> None:
    """Bounded polling for a condition another process makes true."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s")
        await asyncio.sleep(0.02)


def pid_gone(pid: int) -> bool:
    """No such process, or only a zombie left for an init that does not reap (it runs no more)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    if not Path("/proc/self").exists():
        return False  # no /proc: no way to tell a zombie, so it still counts as running
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return True  # it went between the two looks
    return state in ("Z", "X")


def read_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text else None


def registry_for(**config: Any) -> TaskAdapterRegistry:
    return build_registry(AdapterConfig(**config))


async def run(
    registry: TaskAdapterRegistry,
    kind: str,
    args: dict[str, Any],
    token: CancellationToken | None = None,
    **row: Any,
) -> TaskExecutionResult:
    """What a worker does after a claim: resolve, validate, execute."""
    _, adapter = registry.resolve(kind)
    adapter.validate_args(args)
    task = {"id": "t-1", "action_kind": kind, "action_args": args, **row}
    return await adapter.execute(task, cancellation=token or CancellationToken())


def process_evidence(result: TaskExecutionResult) -> dict[str, Any]:
    refs = [r for r in result.evidence_refs if r.get("kind") == "process"]
    assert len(refs) == 1
    return refs[0]


@pytest.fixture(autouse=True)
def no_leftover_processes(tmp_path: Path) -> Iterator[None]:
    """Even when a test fails, kill the grandchildren its scripts recorded in ``*.pid``."""
    yield
    for pid_file in tmp_path.glob("*.pid"):
        pid = read_pid(pid_file)
        if pid is not None and not pid_gone(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def commands() -> TaskAdapterRegistry:
    return registry_for(command_allowlist=frozenset({PY, "sh", "echo", "printenv", "pwd"}))


# -- command ---------------------------------------------------------------------------------


async def test_exit_zero_completes_with_output_and_timing(commands: TaskAdapterRegistry) -> None:
    before = time.time()
    result = await run(commands, "command", {"argv": ["echo", "hello", "world"]})
    assert result.status == "completed"
    assert result.exit_code == 0
    assert result.error_detail is None
    evidence = process_evidence(result)
    assert evidence["output_tail"] == "hello world\n"
    assert evidence["exit_code"] == 0
    assert evidence["argv0"] == "echo"
    assert before <= evidence["started_at"] <= evidence["ended_at"] <= time.time()
    assert evidence["duration_s"] >= 0
    assert evidence["output_truncated"] is False


async def test_non_zero_exit_fails_with_the_exit_code(commands: TaskAdapterRegistry) -> None:
    code = "import sys; print('went wrong', file=sys.stderr); sys.exit(3)"
    result = await run(commands, "command", {"argv": [PY, "-c", code]})
    assert result.status == "failed"
    assert result.exit_code == 3
    assert result.error_detail == "exit code 3\nwent wrong\n"
    assert process_evidence(result)["output_tail"] == "went wrong\n"


async def test_death_by_signal_is_a_failure_naming_the_signal(
    commands: TaskAdapterRegistry,
) -> None:
    result = await run(commands, "command", {"argv": ["sh", "-c", "kill -9 $$"]})
    assert result.status == "failed"
    assert result.exit_code == -signal.SIGKILL
    assert result.error_detail == "killed by SIGKILL"


async def test_argv_is_never_interpreted_by_a_shell(
    commands: TaskAdapterRegistry, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    hostile = [f"; touch {marker}", f"$(touch {marker})", f"`touch {marker}`", "*", "a | b"]
    code = "import json, sys; print(json.dumps(sys.argv[1:]))"
    result = await run(commands, "command", {"argv": [PY, "-c", code, *hostile]})
    assert result.status == "completed"
    assert json.loads(process_evidence(result)["output_tail"]) == hostile
    assert not marker.exists()


async def test_env_is_laid_over_the_minimal_child_env_not_the_workers(
    commands: TaskAdapterRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The worker's own variables stay out (tests/integration/test_child_env.py has the rest).
    monkeypatch.setenv("TASKWARD_TEST_WORKER_VAR", "from-worker")
    monkeypatch.setenv("TASKWARD_TEST_SHADOWED", "worker-value")
    code = (
        "import os; print(os.environ.get('TASKWARD_TEST_WORKER_VAR'),"
        " os.environ['TASKWARD_TEST_SHADOWED'], os.environ['TASKWARD_TEST_TASK_VAR'])"
    )
    args = {
        "argv": [PY, "-c", code],
        "env": {"TASKWARD_TEST_TASK_VAR": "from-task", "TASKWARD_TEST_SHADOWED": "task-value"},
    }
    result = await run(commands, "command", args)
    assert process_evidence(result)["output_tail"] == "None task-value from-task\n"


async def test_cwd_is_where_the_command_runs(commands: TaskAdapterRegistry, tmp_path: Path) -> None:
    result = await run(commands, "command", {"argv": ["pwd"], "cwd": str(tmp_path)})
    assert Path(process_evidence(result)["output_tail"].strip()).resolve() == tmp_path.resolve()


async def test_missing_cwd_is_a_failed_start_not_an_exception(
    commands: TaskAdapterRegistry, tmp_path: Path
) -> None:
    result = await run(commands, "command", {"argv": ["pwd"], "cwd": str(tmp_path / "nope")})
    assert result.status == "failed"
    assert result.exit_code is None
    assert "cannot start 'pwd'" in (result.error_detail or "")


async def test_missing_executable_is_a_failed_start(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-program")
    result = await run(registry_for(command_allowlist=None), "command", {"argv": [missing]})
    assert result.status == "failed"
    assert "cannot start" in (result.error_detail or "")
    bare = await run(registry_for(command_allowlist=None), "command", {"argv": ["no-such-xyz"]})
    assert bare.status == "failed"
    assert "not found on the worker's PATH" in (bare.error_detail or "")


async def test_task_env_cannot_redirect_an_allowlisted_bare_name(
    commands: TaskAdapterRegistry, tmp_path: Path
) -> None:
    fake = tmp_path / "echo"
    fake.write_text("#!/bin/sh\necho FAKE\n")
    fake.chmod(0o755)
    result = await run(
        commands, "command", {"argv": ["echo", "real"], "env": {"PATH": str(tmp_path)}}
    )
    assert process_evidence(result)["output_tail"] == "real\n"


async def test_output_keeps_only_a_bounded_tail(commands: TaskAdapterRegistry) -> None:
    code = "import sys; sys.stdout.write('x' * 100000 + 'END'); sys.stdout.flush()"
    result = await run(commands, "command", {"argv": [PY, "-c", code]})
    evidence = process_evidence(result)
    assert evidence["output_tail"].endswith("xEND")
    assert len(evidence["output_tail"].encode()) == OUTPUT_TAIL_BYTES == 8192
    assert evidence["output_bytes"] == 100003
    assert evidence["output_truncated"] is True


async def test_tail_never_starts_inside_a_utf8_character(commands: TaskAdapterRegistry) -> None:
    code = "import sys; sys.stdout.write('é' * 10000); sys.stdout.flush()"
    result = await run(commands, "command", {"argv": [PY, "-c", code]})
    tail = process_evidence(result)["output_tail"]
    assert set(tail) == {"é"}
    assert len(tail.encode()) <= OUTPUT_TAIL_BYTES


def group_script(pid_file: Path, *, ignore_term: bool = False) -> list[str]:
    """A shell whose background grandchild writes its pid to ``pid_file``, then waits."""
    child = "(trap '' TERM; exec sleep 30)" if ignore_term else "sleep 30"
    return ["sh", "-c", f'{child} & echo $! > "$1"; wait', "sh", str(pid_file)]


async def grandchild_started(pid_file: Path) -> int:
    await wait_until(lambda: read_pid(pid_file) is not None)
    pid = read_pid(pid_file)
    assert pid is not None and not pid_gone(pid)
    return pid


async def test_cancellation_kills_the_whole_process_group(
    commands: TaskAdapterRegistry, tmp_path: Path
) -> None:
    pid_file = tmp_path / "grandchild.pid"
    token = CancellationToken()
    started = time.monotonic()
    execution = asyncio.create_task(
        run(commands, "command", {"argv": group_script(pid_file)}, token)
    )
    grandchild = await grandchild_started(pid_file)
    token.cancel("operator cancel")
    result = await asyncio.wait_for(execution, DEADLINE_S)
    assert result.status == "cancelled"
    assert result.error_detail == "operator cancel"
    assert result.exit_code == -signal.SIGTERM
    await wait_until(lambda: pid_gone(grandchild))
    assert time.monotonic() - started < 5


async def test_timeout_kills_the_whole_process_group(
    commands: TaskAdapterRegistry, tmp_path: Path
) -> None:
    pid_file = tmp_path / "grandchild.pid"
    args = {"argv": group_script(pid_file), "timeout_s": 0.5}
    result = await asyncio.wait_for(run(commands, "command", args), DEADLINE_S)
    assert result.status == "timed_out"
    assert result.retryable is True
    assert "timed out after 0.5s" in (result.error_detail or "")
    grandchild = read_pid(pid_file)
    assert grandchild is not None
    await wait_until(lambda: pid_gone(grandchild))


async def test_a_grandchild_ignoring_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    adapter = CommandAdapter(allowlist={"sh"}, kill_grace_s=0.3)
    pid_file = tmp_path / "grandchild.pid"
    token = CancellationToken()
    task = {"action_args": {"argv": group_script(pid_file, ignore_term=True)}}
    execution = asyncio.create_task(adapter.execute(task, cancellation=token))
    grandchild = await grandchild_started(pid_file)
    token.cancel()
    result = await asyncio.wait_for(execution, DEADLINE_S)
    assert result.status == "cancelled"
    await wait_until(lambda: pid_gone(grandchild))


async def test_stragglers_do_not_outlive_a_command_that_exited(
    commands: TaskAdapterRegistry, tmp_path: Path
) -> None:
    pid_file = tmp_path / "straggler.pid"
    argv = ["sh", "-c", 'sleep 30 & echo $! > "$1"', "sh", str(pid_file)]
    result = await asyncio.wait_for(run(commands, "command", {"argv": argv}), DEADLINE_S)
    assert result.status == "completed"
    straggler = read_pid(pid_file)
    assert straggler is not None
    await wait_until(lambda: pid_gone(straggler))


async def test_cancelling_the_worker_task_still_kills_the_group(
    commands: TaskAdapterRegistry, tmp_path: Path
) -> None:
    pid_file = tmp_path / "grandchild.pid"
    execution = asyncio.create_task(run(commands, "command", {"argv": group_script(pid_file)}))
    grandchild = await grandchild_started(pid_file)
    execution.cancel()
    with pytest.raises(asyncio.CancelledError):
        await execution
    await wait_until(lambda: pid_gone(grandchild))


async def test_cancelled_before_start_runs_nothing(
    commands: TaskAdapterRegistry, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    token = CancellationToken()
    token.cancel()
    args = {"argv": ["sh", "-c", 'touch "$1"', "sh", str(marker)]}
    result = await run(commands, "command", args, token)
    assert result.status == "cancelled"
    assert not marker.exists()


async def test_worker_refuses_a_command_its_allowlist_does_not_hold(tmp_path: Path) -> None:
    # Admitted elsewhere with a wider allowlist; this worker's narrower list still applies.
    marker = tmp_path / "ran"
    adapter = build_registry(AdapterConfig(command_allowlist=frozenset({"echo"}))).get("command")
    assert adapter is not None
    task = {"action_args": {"argv": ["sh", "-c", 'touch "$1"', "sh", str(marker)]}}
    result = await adapter.execute(task, cancellation=CancellationToken())
    assert result.status == "failed"
    assert not marker.exists()


# -- python ----------------------------------------------------------------------------------


@pytest.fixture
def pythons() -> TaskAdapterRegistry:
    return registry_for(python_modules=frozenset({SAMPLE}))


async def test_python_calls_a_sync_function_with_json_kwargs(pythons: TaskAdapterRegistry) -> None:
    args = {"function": f"{SAMPLE}:multiply", "kwargs": {"a": 6, "b": 7}}
    result = await run(pythons, "python", args)
    assert result.status == "completed"
    assert result.evidence_refs == [{"kind": "return_value", "repr": "42"}]


async def test_python_awaits_an_async_function(pythons: TaskAdapterRegistry) -> None:
    args = {"function": f"{SAMPLE}:async_echo", "kwargs": {"value": {"nested": [1, 2]}}}
    result = await run(pythons, "python", args)
    assert result.evidence_refs == [{"kind": "return_value", "repr": "{'nested': [1, 2]}"}]


async def test_python_exception_is_failed_with_the_error(pythons: TaskAdapterRegistry) -> None:
    args = {"function": f"{SAMPLE}:fail", "kwargs": {"message": "no good"}}
    result = await run(pythons, "python", args)
    assert result.status == "failed"
    assert result.error_detail == "ValueError: no good"


async def test_python_passes_a_returned_result_through(pythons: TaskAdapterRegistry) -> None:
    args = {"function": f"{SAMPLE}:report", "kwargs": {"status": "timed_out"}}
    result = await run(pythons, "python", args)
    assert result == TaskExecutionResult(status="timed_out", exit_code=7, error_detail="reported")


async def test_python_passes_the_token_to_a_cancellation_parameter(
    pythons: TaskAdapterRegistry,
) -> None:
    result = await run(pythons, "python", {"function": f"{SAMPLE}:takes_token"})
    assert result.evidence_refs == [{"kind": "return_value", "repr": "True"}]


async def test_python_cancellation_of_an_async_function_is_cancelled(
    pythons: TaskAdapterRegistry, tmp_path: Path
) -> None:
    marker = tmp_path / "started"
    token = CancellationToken()
    args = {"function": f"{SAMPLE}:wait_for_cancel", "kwargs": {"marker": str(marker)}}
    execution = asyncio.create_task(run(pythons, "python", args, token))
    await wait_until(marker.exists)
    token.cancel("stop please")
    result = await asyncio.wait_for(execution, DEADLINE_S)
    assert result.status == "cancelled"
    assert result.error_detail == "stop please"


async def test_python_cancellation_of_a_sync_function_is_cooperative(
    pythons: TaskAdapterRegistry, tmp_path: Path
) -> None:
    marker = tmp_path / "started"
    token = CancellationToken()
    args = {"function": f"{SAMPLE}:sync_wait_for_cancel", "kwargs": {"marker": str(marker)}}
    execution = asyncio.create_task(run(pythons, "python", args, token))
    await wait_until(marker.exists)
    token.cancel()
    result = await asyncio.wait_for(execution, DEADLINE_S)
    assert result.status == "cancelled"
    assert "the function returned" in (result.error_detail or "")


async def test_python_refuses_a_callable_the_allowlisted_module_only_imports(
    pythons: TaskAdapterRegistry,
) -> None:
    args = {"function": f"{SAMPLE}:join", "kwargs": {"a": "/"}}
    result = await run(pythons, "python", args)
    assert result.status == "failed"
    assert "not in the allowlisted module" in (result.error_detail or "")


async def test_python_reports_a_missing_function_or_module() -> None:
    registry = registry_for(python_modules=None)
    missing_fn = await run(registry, "python", {"function": f"{SAMPLE}:nope"})
    assert missing_fn.status == "failed"
    assert "cannot load" in (missing_fn.error_detail or "")
    missing_module = await run(registry, "python", {"function": "no_such_mod_xyz:fn"})
    assert missing_module.status == "failed"


async def test_python_worker_rechecks_its_allowlist() -> None:
    adapter = registry_for().get("python")
    assert adapter is not None
    task = {"action_args": {"function": "os:getcwd"}}
    result = await adapter.execute(task, cancellation=CancellationToken())
    assert result.status == "failed"
    assert "not allowlisted" in (result.error_detail or "")


async def test_decorated_functions_run_under_their_own_kinds() -> None:
    registry = registry_for(imports=(SAMPLE,))
    added = await run(registry, "add", {"a": 2, "b": 3, "objective": "sum"})
    assert added.evidence_refs == [{"kind": "return_value", "repr": "5"}]
    greeted = await run(registry, "greet", {"name": "ada"})
    assert greeted.evidence_refs == [{"kind": "return_value", "repr": "'hello ada!'"}]
    exploded = await run(registry, "explode", {"message": "kaboom"})
    assert exploded.status == "failed"
    assert exploded.error_detail == "RuntimeError: kaboom"
    located = await run(registry, "where", {"objective": "find", "cwd": "/srv"})
    assert located.evidence_refs == [{"kind": "return_value", "repr": "'find in /srv'"}]


async def test_decorated_functions_are_callable_through_python_without_their_module() -> None:
    registry = registry_for(imports=(SAMPLE,))
    args = {"function": f"{SAMPLE}:add", "kwargs": {"a": 1, "b": 1}}
    result = await run(registry, "python", args)
    assert result.evidence_refs == [{"kind": "return_value", "repr": "2"}]
    with pytest.raises(TaskValidationError):
        await run(registry, "python", {"function": f"{SAMPLE}:multiply", "kwargs": {}})


# -- launcher kinds --------------------------------------------------------------------------


@pytest.fixture
def launcher(tmp_path: Path) -> Path:
    """A stand-in launcher that writes its argv (after the program) as JSON to $ARGV_OUT."""
    script = tmp_path / "fake-li"
    script.write_text(
        f"#!{PY}\n"
        "import json, os, sys\n"
        "with open(os.environ['ARGV_OUT'], 'w') as out:\n"
        "    json.dump(sys.argv[1:], out)\n"
        "sys.exit(int(os.environ.get('EXIT_CODE', '0')))\n"
    )
    script.chmod(0o755)
    return script


@pytest.mark.parametrize("kind", LAUNCHER_KINDS)
async def test_launcher_kinds_run_launcher_kind_and_args(
    kind: str, launcher: Path, tmp_path: Path
) -> None:
    out = tmp_path / "argv.json"
    registry = registry_for(launcher=str(launcher))
    args = {
        "objective": "do the thing",
        "model": "m1",
        "max_turns": 2,
        "verbose": True,
        "argv": ["extra", "--flag"],
        "env": {"ARGV_OUT": str(out)},
    }
    result = await run(registry, kind, args)
    assert result.status == "completed", result.error_detail
    assert json.loads(out.read_text()) == [
        kind,
        "--max-turns=2",
        "--model=m1",
        "--objective=do the thing",
        "--verbose",
        "extra",
        "--flag",
    ]


async def test_playbook_alias_runs_the_play_kind(launcher: Path, tmp_path: Path) -> None:
    out = tmp_path / "argv.json"
    registry = registry_for(launcher=str(launcher))
    result = await run(registry, "playbook", {"env": {"ARGV_OUT": str(out)}})
    assert result.status == "completed"
    assert json.loads(out.read_text()) == ["play"]


async def test_launcher_comes_from_taskward_launcher(
    launcher: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "argv.json"
    monkeypatch.setenv("TASKWARD_LAUNCHER", str(launcher))
    registry = build_registry(AdapterConfig.from_env())
    result = await run(registry, "flow", {"name": "nightly", "env": {"ARGV_OUT": str(out)}})
    assert result.status == "completed"
    assert json.loads(out.read_text()) == ["flow", "--name=nightly"]


async def test_launcher_non_zero_exit_fails(launcher: Path, tmp_path: Path) -> None:
    registry = registry_for(launcher=str(launcher))
    env = {"ARGV_OUT": str(tmp_path / "argv.json"), "EXIT_CODE": "4"}
    failed = await run(registry, "agent", {"env": env})
    assert failed.status == "failed"
    assert failed.exit_code == 4


async def test_default_launcher_is_li_resolved_on_the_workers_path() -> None:
    if shutil.which("li") is not None:
        pytest.skip("a real `li` is installed here")
    result = await run(build_registry(), "agent", {"objective": "x"})
    assert result.status == "failed"
    assert result.error_detail == "cannot start 'li': not found on the worker's PATH"


# -- workflow --------------------------------------------------------------------------------


def write_definition(library: Path, ref: str, definition: dict[str, Any]) -> str:
    name, version = ref.split("@")
    body = json.dumps(definition).encode()
    (library / name).mkdir(parents=True, exist_ok=True)
    (library / name / f"{version}.json").write_bytes(body)
    return content_hash_of(body)


def step(code: str) -> dict[str, Any]:
    return {"argv": [PY, "-c", code]}


async def test_workflow_runs_its_steps_in_order(tmp_path: Path) -> None:
    library = tmp_path / "library"
    log = tmp_path / "log.txt"
    append = "import sys; open(sys.argv[1], 'a').write(sys.argv[2])"
    digest = write_definition(
        library,
        "build@1.0",
        {"steps": [{"argv": [PY, "-c", append, str(log), n]} for n in ("1", "2", "3")]},
    )
    registry = registry_for(workflow_library=library)
    result = await run(
        registry, "workflow", {}, library_ref="build@1.0", library_content_hash=digest
    )
    assert result.status == "completed", result.error_detail
    assert log.read_text() == "123"
    steps = [r for r in result.evidence_refs if r["kind"] == "workflow_step"]
    assert [(s["index"], s["status"]) for s in steps] == [
        (0, "completed"),
        (1, "completed"),
        (2, "completed"),
    ]


async def test_workflow_stops_at_the_first_step_that_fails(tmp_path: Path) -> None:
    library = tmp_path / "library"
    marker = tmp_path / "never"
    digest = write_definition(
        library,
        "deploy@2",
        {
            "steps": [
                step("pass"),
                step("import sys; sys.exit(5)"),
                {"argv": ["sh", "-c", 'touch "$1"', "sh", str(marker)]},
            ]
        },
    )
    registry = registry_for(workflow_library=library)
    result = await run(
        registry, "workflow", {}, library_ref="deploy@2", library_content_hash=digest
    )
    assert result.status == "failed"
    assert result.exit_code == 5
    assert (result.error_detail or "").startswith("step 1 failed")
    assert not marker.exists()


async def test_workflow_rejects_a_bad_hash_before_running(tmp_path: Path) -> None:
    library = tmp_path / "library"
    marker = tmp_path / "ran"
    write_definition(
        library, "build@1", {"steps": [{"argv": ["sh", "-c", 'touch "$1"', "sh", str(marker)]}]}
    )
    registry = registry_for(workflow_library=library)
    adapter = registry.get("workflow")
    assert adapter is not None
    wrong = "sha256:" + "f" * 64
    with pytest.raises(TaskValidationError) as info:
        adapter.validate_provenance("build@1", wrong)  # type: ignore[attr-defined]
    assert info.value.field == "library_content_hash"
    result = await run(registry, "workflow", {}, library_ref="build@1", library_content_hash=wrong)
    assert result.status == "failed"
    assert "does not match" in (result.error_detail or "")
    assert not marker.exists()


async def test_workflow_definition_changed_after_admission_does_not_run(tmp_path: Path) -> None:
    library = tmp_path / "library"
    marker = tmp_path / "ran"
    digest = write_definition(library, "build@1", {"steps": [step("pass")]})
    registry = registry_for(workflow_library=library)
    registry.get("workflow").validate_provenance("build@1", digest)  # type: ignore[union-attr]
    write_definition(
        library, "build@1", {"steps": [{"argv": ["sh", "-c", 'touch "$1"', "sh", str(marker)]}]}
    )
    result = await run(registry, "workflow", {}, library_ref="build@1", library_content_hash=digest)
    assert result.status == "failed"
    assert not marker.exists()


async def test_workflow_missing_provenance_fails(tmp_path: Path) -> None:
    registry = registry_for(workflow_library=tmp_path)
    result = await run(registry, "workflow", {})
    assert result.status == "failed"
    assert "library_ref" in (result.error_detail or "")


async def test_workflow_timeout_bounds_the_whole_run(tmp_path: Path) -> None:
    library = tmp_path / "library"
    digest = write_definition(
        library, "slow@1", {"steps": [step("pass"), step("import time; time.sleep(100)")]}
    )
    registry = registry_for(workflow_library=library)
    result = await asyncio.wait_for(
        run(
            registry,
            "workflow",
            {"timeout_s": 0.5},
            library_ref="slow@1",
            library_content_hash=digest,
        ),
        DEADLINE_S,
    )
    assert result.status == "timed_out"
    assert result.retryable is True
    assert (result.error_detail or "").startswith("step 1 timed_out")


async def test_workflow_cancellation_stops_the_running_step(tmp_path: Path) -> None:
    library = tmp_path / "library"
    pid_file = tmp_path / "grandchild.pid"
    digest = write_definition(
        library, "long@1", {"steps": [{"argv": group_script(pid_file)}, step("pass")]}
    )
    registry = registry_for(workflow_library=library)
    token = CancellationToken()
    execution = asyncio.create_task(
        run(registry, "workflow", {}, token, library_ref="long@1", library_content_hash=digest)
    )
    grandchild = await grandchild_started(pid_file)
    token.cancel()
    result = await asyncio.wait_for(execution, DEADLINE_S)
    assert result.status == "cancelled"
    await wait_until(lambda: pid_gone(grandchild))


# -- admission sees the same registry ---------------------------------------------------------


def test_admission_normalises_playbook_and_checks_workflow_provenance(tmp_path: Path) -> None:
    from taskward.admission import validate_application

    digest = write_definition(tmp_path, "build@1", {"steps": [step("pass")]})
    registry = registry_for(workflow_library=tmp_path, command_allowlist=frozenset({"echo"}))
    app = TaskApplication(
        action_kind="playbook", args={}, execution_target="host", idempotency_key="k1"
    )
    assert validate_application(app, registry).action_kind == "play"
    assert app.action_kind == "playbook"
    workflow = TaskApplication(
        action_kind="workflow",
        args={},
        execution_target="host",
        idempotency_key="k2",
        library_ref="build@1",
        library_content_hash=digest,
    )
    validate_application(workflow, registry)
    with pytest.raises(TaskValidationError) as info:
        validate_application(
            TaskApplication(
                action_kind="workflow",
                args={},
                execution_target="host",
                idempotency_key="k3",
                library_ref="build@1",
            ),
            registry,
        )
    assert info.value.field == "library_content_hash"
    with pytest.raises(TaskValidationError) as info:
        validate_application(
            TaskApplication(
                action_kind="command",
                args={"argv": ["rm", "-rf", "/"]},
                execution_target="host",
                idempotency_key="k4",
            ),
            registry,
        )
    assert info.value.field == "args.argv[0]"

"""Adapters without subprocesses: configuration, registry building, validation, argv building and
the python adapter's call semantics (ADR-0072 D4, DESIGN.md "Action kinds and adapters")."""

from __future__ import annotations

import asyncio
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import taskward
from taskward import (
    AdapterConfig,
    AdapterNotRegistered,
    CancellationToken,
    TaskAdapter,
    TaskAdapterRegistry,
    TaskExecutionResult,
    TaskValidationError,
    build_registry,
)
from taskward.adapters import (
    LAUNCHER_KINDS,
    CommandAdapter,
    FileWorkflowLibrary,
    LauncherAdapter,
    PythonAdapter,
    PythonFunctionAdapter,
    WorkflowAdapter,
)
from taskward.adapters.launcher import launcher_argv
from taskward.adapters.process import task_args
from taskward.adapters.python import run_callable, task_functions, task_kind
from taskward.adapters.workflow import content_hash_of

SAMPLE = "tests.fixtures.sample_tasks"
BUILTIN_KINDS = sorted(["command", "python", *LAUNCHER_KINDS])


def validation_error(call: Any, *args: Any) -> TaskValidationError:
    with pytest.raises(TaskValidationError) as info:
        call(*args)
    return info.value


# -- AdapterConfig --------------------------------------------------------------------------


def test_default_config_allows_no_command_and_no_module() -> None:
    config = AdapterConfig()
    assert config.command_allowlist == frozenset()
    assert config.python_modules == frozenset()
    assert config.imports == ()
    assert config.launcher == "li"
    assert config.workflow_library is None
    assert config.unfenced_kinds() == ()


def test_from_env_reads_every_variable() -> None:
    config = AdapterConfig.from_env(
        {
            "TASKWARD_COMMAND_ALLOWLIST": "echo, /usr/bin/true;git",
            "TASKWARD_PYTHON_MODULES": "app.jobs,app.more",
            "TASKWARD_IMPORTS": "app.tasks, app.other",
            "TASKWARD_LAUNCHER": "/opt/bin/li",
            "TASKWARD_WORKFLOW_LIBRARY": "/srv/workflows",
        }
    )
    assert config.command_allowlist == frozenset({"echo", "/usr/bin/true", "git"})
    assert config.python_modules == frozenset({"app.jobs", "app.more"})
    assert config.imports == ("app.tasks", "app.other")
    assert config.launcher == "/opt/bin/li"
    assert config.workflow_library == Path("/srv/workflows")


def test_from_env_with_nothing_set_is_the_closed_default() -> None:
    assert AdapterConfig.from_env({}) == AdapterConfig()
    assert AdapterConfig.from_env({"TASKWARD_LAUNCHER": "  "}).launcher == "li"


@pytest.mark.parametrize("value", ["*", " * ", "echo,*"])
def test_from_env_star_allows_all(value: str) -> None:
    config = AdapterConfig.from_env(
        {"TASKWARD_COMMAND_ALLOWLIST": value, "TASKWARD_PYTHON_MODULES": value}
    )
    assert config.command_allowlist is None
    assert config.python_modules is None
    assert config.unfenced_kinds() == ("command", "python")


def test_from_env_overrides_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASKWARD_LAUNCHER", "from-env")
    monkeypatch.setenv("TASKWARD_IMPORTS", "a,b")
    config = AdapterConfig.from_env(imports=("c",))
    assert config.launcher == "from-env"
    assert config.imports == ("c",)


def test_allow_all_is_announced_by_unfenced_kinds() -> None:
    config = AdapterConfig.allow_all(launcher="x")
    assert config.command_allowlist is None and config.python_modules is None
    assert config.launcher == "x"
    assert config.unfenced_kinds() == ("command", "python")


# -- build_registry and the registry ----------------------------------------------------------


def test_build_registry_has_the_builtins_and_no_workflow_without_a_library() -> None:
    registry = build_registry()
    assert registry.kinds() == BUILTIN_KINDS
    assert "workflow" not in registry
    assert registry.get("workflow") is None


def test_build_registry_registers_workflow_only_with_a_library(tmp_path: Path) -> None:
    registry = build_registry(AdapterConfig(workflow_library=tmp_path))
    assert registry.kinds() == sorted([*BUILTIN_KINDS, "workflow"])
    assert isinstance(registry.get("workflow"), WorkflowAdapter)


def test_build_registry_refuses_a_workflow_library_that_is_not_a_directory(
    tmp_path: Path,
) -> None:
    error = validation_error(build_registry, AdapterConfig(workflow_library=tmp_path / "nope"))
    assert error.field == "workflow_library"


def test_builtin_adapters_satisfy_the_protocol(tmp_path: Path) -> None:
    registry = build_registry(AdapterConfig(workflow_library=tmp_path, imports=(SAMPLE,)))
    for kind in registry.kinds():
        adapter = registry.get(kind)
        assert isinstance(adapter, TaskAdapter)
        assert adapter.action_kind == kind


def test_build_registry_uses_the_configured_launcher() -> None:
    registry = build_registry(AdapterConfig(launcher="/opt/li"))
    for kind in LAUNCHER_KINDS:
        adapter = registry.get(kind)
        assert isinstance(adapter, LauncherAdapter)
        assert adapter.launcher == "/opt/li"


def test_playbook_is_an_alias_of_play() -> None:
    registry = build_registry()
    assert registry.get("playbook") is registry.get("play")
    assert "playbook" in registry
    assert registry.resolve("playbook") == ("play", registry.get("play"))
    assert registry.aliases == {"playbook": "play"}
    assert "playbook" not in registry.kinds()


def test_unknown_kind_lists_the_registered_kinds_and_aliases() -> None:
    registry = build_registry()
    with pytest.raises(AdapterNotRegistered) as info:
        registry.resolve("shel")
    error = info.value
    assert isinstance(error, TaskValidationError) and isinstance(error, ValueError)
    assert error.field == "action_kind"
    assert error.value == "shel"
    assert error.registered == BUILTIN_KINDS
    assert str(error) == (
        "action_kind 'shel' is not registered; registered kinds: "
        + ", ".join(BUILTIN_KINDS)
        + "; aliases: playbook -> play"
    )


def test_non_string_kind_is_not_registered() -> None:
    with pytest.raises(AdapterNotRegistered):
        build_registry().resolve(None)
    assert 3 not in build_registry()


def test_registering_an_alias_name_or_a_taken_kind_is_refused() -> None:
    registry = TaskAdapterRegistry([CommandAdapter()])
    error = validation_error(registry.register, LauncherAdapter("playbook"))
    assert "alias" in str(error)
    error = validation_error(registry.register, CommandAdapter())
    assert "already registered" in str(error)
    command = registry.get("command")
    assert command is not None
    registry.register(command)  # the same adapter again is a no-op
    assert registry.kinds() == ["command"]


def test_missing_import_is_a_validation_error_naming_the_module() -> None:
    error = validation_error(build_registry, AdapterConfig(imports=("no_such_module_xyz",)))
    assert error.field == "imports"
    assert error.value == "no_such_module_xyz"


# -- @taskward.task ---------------------------------------------------------------------------


def test_task_decorator_forms_mark_without_wrapping() -> None:
    def plain() -> None: ...

    assert taskward.task(plain) is plain
    assert task_kind(plain) == "plain"

    def empty() -> None: ...

    assert taskward.task()(empty) is empty
    assert task_kind(empty) == "empty"

    def positional() -> None: ...

    assert taskward.task("named")(positional) is positional
    assert task_kind(positional) == "named"

    def keyword() -> None: ...

    assert taskward.task(kind="kw")(keyword) is keyword
    assert task_kind(keyword) == "kw"


@pytest.mark.parametrize("kind", ["", "has space", " lead", 5])
def test_task_decorator_rejects_bad_kinds(kind: Any) -> None:
    def fn() -> None: ...

    with pytest.raises(TaskValidationError) as info:
        taskward.task(kind=kind)(fn)
    assert info.value.field == "kind"


def test_marking_changes_no_registry() -> None:
    import tests.fixtures.sample_tasks  # noqa: F401 - importing must register nothing

    plain = build_registry()
    assert plain.kinds() == BUILTIN_KINDS
    with_imports = build_registry(AdapterConfig(imports=(SAMPLE,)))
    assert with_imports.kinds() == sorted([*BUILTIN_KINDS, "add", "explode", "greet", "where"])
    assert build_registry().kinds() == BUILTIN_KINDS
    adapter = with_imports.get("greet")
    assert isinstance(adapter, PythonFunctionAdapter)
    assert adapter.target == f"{SAMPLE}:say_hello"


@pytest.fixture
def synthetic_module(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    module = types.ModuleType("taskward_test_synthetic")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    yield module


def test_a_decorated_kind_cannot_shadow_a_builtin(synthetic_module: types.ModuleType) -> None:
    def impostor() -> None: ...

    synthetic_module.impostor = taskward.task(kind="command")(impostor)  # type: ignore[attr-defined]
    error = validation_error(build_registry, AdapterConfig(imports=(synthetic_module.__name__,)))
    assert "already registered" in str(error)


def test_a_decorated_kind_cannot_take_an_alias(synthetic_module: types.ModuleType) -> None:
    def impostor() -> None: ...

    synthetic_module.impostor = taskward.task(kind="playbook")(impostor)  # type: ignore[attr-defined]
    error = validation_error(build_registry, AdapterConfig(imports=(synthetic_module.__name__,)))
    assert "alias" in str(error)


def test_two_functions_claiming_one_kind_are_refused() -> None:
    first = types.ModuleType("first")
    second = types.ModuleType("second")

    def one() -> None: ...

    def two() -> None: ...

    first.one = taskward.task(kind="same")(one)  # type: ignore[attr-defined]
    second.two = taskward.task(kind="same")(two)  # type: ignore[attr-defined]
    error = validation_error(task_functions, [first, second])
    assert error.field == "kind" and error.value == "same"
    # The same function re-exported by a second module is one kind, not a conflict.
    second.two = first.one  # type: ignore[attr-defined]
    assert list(task_functions([first, second])) == ["same"]


def test_function_adapter_checks_args_against_the_signature() -> None:
    registry = build_registry(AdapterConfig(imports=(SAMPLE,)))
    add = registry.get("add")
    assert add is not None
    add.validate_args({"a": 1, "b": 2})
    add.validate_args({"a": 1, "b": 2, "objective": "sum", "cwd": "/", "timeout_s": 5})
    error = validation_error(add.validate_args, {"a": 1})
    assert error.field == "args"
    assert "a, b" in str(error)
    validation_error(add.validate_args, {"a": 1, "b": 2, "c": 3})
    where = registry.get("where")
    assert where is not None
    where.validate_args({"objective": "x"})
    validation_error(where.validate_args, {})


# -- command validation ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ({}, "args.argv"),
        ({"argv": "echo hi"}, "args.argv"),
        ({"argv": []}, "args.argv"),
        ({"argv": ["echo", 1]}, "args.argv"),
        ({"argv": [""]}, "args.argv[0]"),
        ({"argv": ["echo", "a\0b"]}, "args.argv[1]"),
        ({"argv": ["echo"], "cwd": ""}, "args.cwd"),
        ({"argv": ["echo"], "cwd": 5}, "args.cwd"),
        ({"argv": ["echo"], "env": ["A=1"]}, "args.env"),
        ({"argv": ["echo"], "env": {"A": 1}}, "args.env"),
        ({"argv": ["echo"], "env": {"A=B": "1"}}, "args.env"),
        ({"argv": ["echo"], "env": {"LD_PRELOAD": "/tmp/x.so"}}, "args.env.LD_PRELOAD"),
        ({"argv": ["echo"], "timeout_s": 0}, "args.timeout_s"),
        ({"argv": ["echo"], "timeout_s": -1}, "args.timeout_s"),
        ({"argv": ["echo"], "timeout_s": True}, "args.timeout_s"),
        ({"argv": ["echo"], "timeout_s": "5"}, "args.timeout_s"),
    ],
)
def test_command_rejects_bad_args_naming_the_field(args: dict[str, Any], field: str) -> None:
    adapter = CommandAdapter(allowlist={"echo"})
    assert validation_error(adapter.validate_args, args).field == field


def test_command_accepts_good_args() -> None:
    CommandAdapter(allowlist={"echo"}).validate_args(
        {"argv": ["echo", "hi"], "cwd": "/", "env": {"A": "1"}, "timeout_s": 1.5}
    )


def test_command_off_the_allowlist_names_argv0_and_lists_the_allowlist() -> None:
    adapter = CommandAdapter(allowlist={"echo", "/usr/bin/true"})
    error = validation_error(adapter.validate_args, {"argv": ["rm", "-rf", "/"]})
    assert error.field == "args.argv[0]"
    assert error.value == "rm"
    assert error.allowed == "/usr/bin/true, echo"
    assert str(error) == (
        "args.argv[0] 'rm' is not on the command allowlist; allowed: /usr/bin/true, echo"
    )


def test_command_with_an_empty_allowlist_says_how_to_allow() -> None:
    error = validation_error(CommandAdapter().validate_args, {"argv": ["echo"]})
    assert "TASKWARD_COMMAND_ALLOWLIST" in str(error)


def test_a_path_does_not_match_an_allowlisted_bare_name() -> None:
    adapter = CommandAdapter(allowlist={"echo"})
    validation_error(adapter.validate_args, {"argv": ["/tmp/evil/echo"]})
    validation_error(adapter.validate_args, {"argv": ["./echo"]})
    adapter = CommandAdapter(allowlist={"/bin/echo"})
    validation_error(adapter.validate_args, {"argv": ["echo"]})
    adapter.validate_args({"argv": ["/bin/echo"]})


def test_no_allowlist_allows_any_executable_and_loader_variables() -> None:
    adapter = CommandAdapter(allowlist=None)
    adapter.validate_args({"argv": ["/any/thing"], "env": {"LD_LIBRARY_PATH": "/x"}})


@pytest.mark.parametrize("entry", ["bin/tool", "", "./tool"])
def test_allowlist_entries_are_bare_names_or_absolute_paths(entry: str) -> None:
    with pytest.raises(TaskValidationError) as info:
        CommandAdapter(allowlist={entry})
    assert info.value.field == "command_allowlist"


def test_allowlist_given_as_one_string_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        CommandAdapter(allowlist="echo")


async def test_command_execute_rechecks_this_workers_allowlist() -> None:
    result = await CommandAdapter(allowlist={"true"}).execute(
        {"action_args": {"argv": ["false"]}}, cancellation=CancellationToken()
    )
    assert result.status == "failed"
    assert result.exit_code is None
    assert "not on the command allowlist" in (result.error_detail or "")


def test_task_args_accepts_decoded_and_json_text_args() -> None:
    assert task_args({"action_args": {"a": 1}}) == {"a": 1}
    assert task_args({"action_args": '{"a": 1}'}) == {"a": 1}
    assert task_args({}) == {}
    assert validation_error(task_args, {"action_args": "[1]"}).field == "action_args"
    assert validation_error(task_args, {"action_args": "{nope"}).field == "action_args"


# -- python validation -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "function",
    [None, 3, "", "module", "module:", ":fn", "a b:fn", "mod:fn()", "mod:a.b", "1mod:fn", "m..n:f"],
)
def test_python_rejects_malformed_targets(function: Any) -> None:
    error = validation_error(PythonAdapter(modules=None).validate_args, {"function": function})
    assert error.field == "args.function"


def test_python_refuses_dunder_targets() -> None:
    adapter = PythonAdapter(modules=None)
    validation_error(adapter.validate_args, {"function": "os:__getattr__"})


def test_python_off_the_allowlist_lists_modules_and_functions() -> None:
    functions = task_functions([__import__(SAMPLE, fromlist=["x"])])
    adapter = PythonAdapter(modules={"app.jobs"}, functions=functions)
    error = validation_error(adapter.validate_args, {"function": "os:system", "kwargs": {}})
    assert error.field == "args.function"
    assert error.value == "os:system"
    assert "app.jobs" in str(error)
    assert f"{SAMPLE}:add" in str(error)


def test_python_with_no_modules_says_how_to_allow() -> None:
    error = validation_error(PythonAdapter().validate_args, {"function": "os:getcwd"})
    assert "TASKWARD_PYTHON_MODULES" in str(error)


def test_python_allows_listed_modules_registered_functions_or_anything() -> None:
    PythonAdapter(modules={"app.jobs"}).validate_args({"function": "app.jobs:run"})
    PythonAdapter(modules=None).validate_args({"function": "anything.at:all"})
    registry = build_registry(AdapterConfig(imports=(SAMPLE,)))
    python = registry.get("python")
    assert python is not None
    python.validate_args({"function": f"{SAMPLE}:add", "kwargs": {"a": 1, "b": 2}})
    # A registered function does not open its whole module.
    validation_error(python.validate_args, {"function": f"{SAMPLE}:multiply"})


def test_a_listed_package_does_not_allow_its_submodules() -> None:
    adapter = PythonAdapter(modules={"app"})
    validation_error(adapter.validate_args, {"function": "app.sub:fn"})


def test_python_checks_kwargs() -> None:
    adapter = PythonAdapter(modules=None)
    assert validation_error(adapter.validate_args, {"function": "m:f", "kwargs": [1]}).field == (
        "args.kwargs"
    )
    adapter.validate_args({"function": "m:f", "kwargs": None})
    error = validation_error(
        adapter.validate_args, {"function": "m:f", "kwargs": {"cancellation": 1}}
    )
    assert error.field == "args.kwargs.cancellation"


def test_python_checks_kwargs_of_registered_functions_against_the_signature() -> None:
    python = build_registry(AdapterConfig(imports=(SAMPLE,))).get("python")
    assert python is not None
    error = validation_error(python.validate_args, {"function": f"{SAMPLE}:add", "kwargs": {}})
    assert error.field == "args.kwargs"


def test_modules_given_as_one_string_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        PythonAdapter(modules="app")


# -- run_callable: sync, async, errors, cancellation ------------------------------------------


async def test_sync_function_runs_in_a_thread_and_completes() -> None:
    import threading

    main = threading.get_ident()

    def fn(x: int) -> int:
        assert threading.get_ident() != main
        return x * 2

    result = await run_callable(fn, {"x": 21}, CancellationToken())
    assert result.status == "completed"
    assert result.exit_code == 0
    assert result.evidence_refs == [{"kind": "return_value", "repr": "42"}]


async def test_async_function_completes_without_evidence_for_none() -> None:
    async def fn() -> None:
        await asyncio.sleep(0)

    result = await run_callable(fn, {}, CancellationToken())
    assert result == TaskExecutionResult(status="completed", exit_code=0)


async def test_callable_object_with_async_call_is_awaited() -> None:
    class Job:
        async def __call__(self, value: str) -> str:
            return value.upper()

    result = await run_callable(Job(), {"value": "ok"}, CancellationToken())
    assert result.evidence_refs == [{"kind": "return_value", "repr": "'OK'"}]


@pytest.mark.parametrize("is_async", [False, True])
async def test_exception_is_a_failure_with_the_error_in_error_detail(is_async: bool) -> None:
    def sync_fn() -> None:
        raise ValueError("bad input: 42")

    async def async_fn() -> None:
        raise ValueError("bad input: 42")

    result = await run_callable(async_fn if is_async else sync_fn, {}, CancellationToken())
    assert result.status == "failed"
    assert result.exit_code == 1
    assert result.error_detail == "ValueError: bad input: 42"
    assert result.evidence_refs[0]["kind"] == "traceback"
    assert "bad input: 42" in result.evidence_refs[0]["text"]


async def test_system_exit_in_a_task_is_a_failure_not_a_worker_exit() -> None:
    def fn() -> None:
        sys.exit(3)

    result = await run_callable(fn, {}, CancellationToken())
    assert result.status == "failed"
    assert "SystemExit" in (result.error_detail or "")


@pytest.mark.parametrize("is_async", [False, True])
async def test_returned_execution_result_passes_through(is_async: bool) -> None:
    own = TaskExecutionResult(status="timed_out", exit_code=9, invocation_id="inv-1")

    def sync_fn() -> TaskExecutionResult:
        return own

    async def async_fn() -> TaskExecutionResult:
        return own

    assert await run_callable(async_fn if is_async else sync_fn, {}, CancellationToken()) is own


async def test_function_taking_cancellation_receives_the_token() -> None:
    token = CancellationToken()
    seen: list[CancellationToken] = []

    def fn(cancellation: CancellationToken) -> None:
        seen.append(cancellation)

    await run_callable(fn, {}, token)
    assert seen == [token]


async def test_cancelling_an_async_function_is_cancelled() -> None:
    token = CancellationToken()
    started = asyncio.Event()
    cleaned_up = asyncio.Event()

    async def fn() -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        finally:
            cleaned_up.set()

    run = asyncio.create_task(run_callable(fn, {}, token))
    await asyncio.wait_for(started.wait(), 5)
    token.cancel("operator asked")
    result = await asyncio.wait_for(run, 5)
    assert result.status == "cancelled"
    assert result.error_detail == "operator asked"
    assert cleaned_up.is_set()


async def test_async_function_that_swallows_cancellation_is_still_cancelled() -> None:
    token = CancellationToken()
    started = asyncio.Event()

    async def fn() -> str:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            return "ignored it"
        return "finished"

    run = asyncio.create_task(run_callable(fn, {}, token))
    await asyncio.wait_for(started.wait(), 5)
    token.cancel()
    result = await asyncio.wait_for(run, 5)
    assert result.status == "cancelled"
    assert "returned" in (result.error_detail or "")


async def test_cancelling_a_sync_function_waits_for_it_to_stop() -> None:
    token = CancellationToken()
    started = asyncio.Event()
    loop = asyncio.get_running_loop()
    stopped: list[bool] = []

    def fn(cancellation: CancellationToken) -> None:
        loop.call_soon_threadsafe(started.set)
        import time

        deadline = time.monotonic() + 10
        while not cancellation.is_cancelled and time.monotonic() < deadline:
            time.sleep(0.005)
        stopped.append(cancellation.is_cancelled)

    run = asyncio.create_task(run_callable(fn, {}, token))
    await asyncio.wait_for(started.wait(), 5)
    token.cancel()
    result = await asyncio.wait_for(run, 5)
    # The result is reported only once the thread really ended (a request is not a stop).
    assert stopped == [True]
    assert result.status == "cancelled"


async def test_cancelled_before_the_call_never_calls() -> None:
    token = CancellationToken()
    token.cancel()
    called: list[bool] = []
    result = await run_callable(lambda: called.append(True), {}, token)
    assert result.status == "cancelled"
    assert called == []


async def test_unrequested_cancelled_error_is_a_failure() -> None:
    async def fn() -> None:
        raise asyncio.CancelledError

    result = await run_callable(fn, {}, CancellationToken())
    assert result.status == "failed"


async def test_cancelling_the_caller_cancels_the_function() -> None:
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def fn() -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    run = asyncio.create_task(run_callable(fn, {}, CancellationToken()))
    await asyncio.wait_for(started.wait(), 5)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    await asyncio.wait_for(cancelled.wait(), 5)


async def test_a_caller_cancelled_as_the_token_fires_is_still_cancelled() -> None:
    """Both at once: the function is cancelled by the request and the caller by its own
    canceller; the caller's cancellation wins (it must not be turned into a result)."""
    token = CancellationToken()
    started = asyncio.Event()

    async def fn() -> None:
        started.set()
        await asyncio.sleep(60)

    run = asyncio.create_task(run_callable(fn, {}, token))
    await asyncio.wait_for(started.wait(), 5)
    token.cancel("operator asked")
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run


class _Stop(BaseException):
    """Not an Exception: it ends the worker, never a task's failure."""


@pytest.mark.parametrize("suspends", [False, True])
async def test_a_base_exception_from_the_function_propagates(suspends: bool) -> None:
    async def fn() -> None:
        if suspends:
            await asyncio.sleep(0)
        raise _Stop

    with pytest.raises(_Stop):
        await run_callable(fn, {}, CancellationToken())


# -- launcher argv ---------------------------------------------------------------------------


def test_launcher_argv_is_kind_then_sorted_flags_then_argv() -> None:
    args = {
        "objective": "ship it",
        "model": "m-1",
        "max_turns": 3,
        "temperature": 0.5,
        "verbose": True,
        "dry_run": False,
        "profile": None,
        "tag": ["a", "b"],
        "argv": ["--extra", "positional"],
        "cwd": "/tmp",
        "env": {"A": "1"},
        "timeout_s": 10,
    }
    assert launcher_argv("li", "agent", args) == [
        "li",
        "agent",
        "--max-turns=3",
        "--model=m-1",
        "--objective=ship it",
        "--tag=a",
        "--tag=b",
        "--temperature=0.5",
        "--verbose",
        "--extra",
        "positional",
    ]


def test_launcher_value_starting_with_a_dash_stays_a_value() -> None:
    assert launcher_argv("li", "flow", {"name": "--rm"}) == ["li", "flow", "--name=--rm"]


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ({"argv": "x"}, "args.argv"),
        ({"argv": [1]}, "args.argv"),
        ({"-x": "1"}, "args"),
        ({"a b": "1"}, "args"),
        ({"nested": {"a": 1}}, "args.nested"),
        ({"items": [[1]]}, "args.items"),
        ({"items": [True]}, "args.items"),
        ({"text": "a\0b"}, "args.text"),
        ({"timeout_s": True}, "args.timeout_s"),
        ({"timeout_s": 0}, "args.timeout_s"),
        ({"env": {"LD_PRELOAD": "x"}}, "args.env.LD_PRELOAD"),
        ({"cwd": 3}, "args.cwd"),
    ],
)
def test_launcher_rejects_bad_args(args: dict[str, Any], field: str) -> None:
    assert validation_error(LauncherAdapter("agent").validate_args, args).field == field


def test_launcher_accepts_scalars_lists_and_process_args() -> None:
    LauncherAdapter("flow_yaml").validate_args(
        {"file": "f.yaml", "n": 2, "x": 1.5, "b": False, "z": None, "tags": ["a", 1]}
    )
    LauncherAdapter("engine").validate_args({})


@pytest.mark.parametrize("launcher", ["", "  ", None])
def test_launcher_must_be_named(launcher: Any) -> None:
    with pytest.raises(TaskValidationError):
        LauncherAdapter("agent", launcher=launcher)


# -- workflow library ------------------------------------------------------------------------


def write_definition(root: Path, ref: str, body: bytes) -> str:
    name, version = ref.split("@")
    (root / name).mkdir(parents=True, exist_ok=True)
    (root / name / f"{version}.json").write_bytes(body)
    return content_hash_of(body)


def test_content_hash_is_sha256_of_the_file_bytes(tmp_path: Path) -> None:
    import hashlib

    body = b'{"steps": [{"argv": ["true"]}]}'
    digest = write_definition(tmp_path, "build@1", body)
    assert digest == "sha256:" + hashlib.sha256(body).hexdigest()
    assert FileWorkflowLibrary(tmp_path).load("build@1", digest)["steps"] == [{"argv": ["true"]}]


@pytest.mark.parametrize("ref", ["..@1", "../x@1", "a@..", ".hidden@1", "a", "a@b@c", "", "a/b@1"])
def test_library_refs_cannot_escape_the_library(tmp_path: Path, ref: str) -> None:
    error = validation_error(FileWorkflowLibrary(tmp_path).path, ref)
    assert error.field == "library_ref"


def test_bad_hash_is_rejected(tmp_path: Path) -> None:
    write_definition(tmp_path, "build@1", b'{"steps": [{"argv": ["true"]}]}')
    library = FileWorkflowLibrary(tmp_path)
    wrong = "sha256:" + "0" * 64
    error = validation_error(library.load, "build@1", wrong)
    assert error.field == "library_content_hash"
    assert "does not match build@1" in str(error)
    for malformed in ["0" * 64, "sha256:XYZ", "md5:" + "0" * 32, "SHA256:" + "0" * 64]:
        assert validation_error(library.load, "build@1", malformed).field == (
            "library_content_hash"
        )


def test_missing_definition_is_rejected(tmp_path: Path) -> None:
    error = validation_error(FileWorkflowLibrary(tmp_path).load, "nope@1", "sha256:" + "0" * 64)
    assert error.field == "library_ref"


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        b'{"steps": []}',
        b'{"steps": [{"argv": []}]}',
        b'{"steps": [{"argv": "true"}]}',
        b'{"steps": [{"argv": ["true"], "timeout_s": -1}]}',
        b'{"steps": ["true"]}',
    ],
)
def test_malformed_definitions_are_rejected(tmp_path: Path, body: bytes) -> None:
    digest = write_definition(tmp_path, "bad@1", body)
    error = validation_error(FileWorkflowLibrary(tmp_path).load, "bad@1", digest)
    assert error.field.startswith(("library_ref", "steps[0]"))


def test_workflow_provenance_requires_both_fields(tmp_path: Path) -> None:
    digest = write_definition(tmp_path, "build@1", b'{"steps": [{"argv": ["true"]}]}')
    adapter = WorkflowAdapter(FileWorkflowLibrary(tmp_path))
    assert validation_error(adapter.validate_provenance, None, digest).field == "library_ref"
    error = validation_error(adapter.validate_provenance, "build@1", None)
    assert error.field == "library_content_hash"
    adapter.validate_provenance("build@1", digest)
    assert validation_error(adapter.validate_args, {"timeout_s": 0}).field == "args.timeout_s"


def test_a_name_set_that_bound_once_is_still_refused_when_another_does_not_fit() -> None:
    """The python adapter remembers name sets that bound; others are still checked."""
    adapter = PythonFunctionAdapter("t.cached", _takes_x)
    adapter.validate_args({"x": 1})
    adapter.validate_args({"x": 2})  # the remembered set
    with pytest.raises(TaskValidationError):
        adapter.validate_args({"y": 1})
    with pytest.raises(TaskValidationError):
        adapter.validate_args({})  # x is required
    with pytest.raises(TaskValidationError):
        adapter.validate_args({"x": 1, "cancellation": None})  # the token is the worker's


def _takes_x(x: int, cancellation: object = None) -> None:
    return None


async def test_cancellation_callbacks_fire_once_and_can_be_withdrawn() -> None:
    token = CancellationToken()
    fired: list[str] = []
    token.on_cancel(lambda: fired.append("a"))
    withdraw = token.on_cancel(lambda: fired.append("b"))
    withdraw()
    token.cancel("first")
    token.cancel("second")  # idempotent: nothing fires again, the first reason stays
    assert fired == ["a"] and token.reason == "first"
    token.on_cancel(lambda: fired.append("late"))  # already requested: called at once
    assert fired == ["a", "late"]

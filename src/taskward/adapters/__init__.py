"""Built-in adapters and ``build_registry``: how each process assembles its adapter registry.

There is no module-level registry. A process builds one explicitly from the built-ins plus the
modules named in its configuration (``--import`` / ``TASKWARD_IMPORTS``), the same way in the
CLI, the service and the worker (DESIGN.md "Action kinds and adapters").
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from taskward.adapters.calling import DEFAULT_MAX_RESULT_BYTES, check_max_result_bytes
from taskward.adapters.childenv import ENV_CHILD_ENV_PASSTHROUGH, parse_env_passthrough
from taskward.adapters.command import CommandAdapter
from taskward.adapters.context import TaskContext
from taskward.adapters.launcher import DEFAULT_LAUNCHER, LAUNCHER_KINDS, LauncherAdapter
from taskward.adapters.python import PythonAdapter, PythonFunctionAdapter, task, task_functions
from taskward.adapters.workflow import FileWorkflowLibrary, WorkflowAdapter, WorkflowLibrary
from taskward.errors import TaskValidationError
from taskward.registry import (
    DEFAULT_MAX_TASK_TIMEOUT_S,
    TaskAdapter,
    TaskAdapterRegistry,
    check_max_task_timeout,
)

__all__ = [
    "LAUNCHER_KINDS",
    "AdapterConfig",
    "CommandAdapter",
    "FileWorkflowLibrary",
    "LauncherAdapter",
    "PythonAdapter",
    "PythonFunctionAdapter",
    "TaskContext",
    "WorkflowAdapter",
    "WorkflowLibrary",
    "build_registry",
    "task",
]

ALLOW_ALL: Final = "*"


def _split(value: str | None) -> tuple[str, ...]:
    return tuple(p.strip() for p in (value or "").replace(";", ",").split(",") if p.strip())


ENV_MAX_TASK_TIMEOUT: Final = "TASKWARD_MAX_TASK_TIMEOUT_S"


def _max_task_timeout(value: str | None) -> float:
    """``TASKWARD_MAX_TASK_TIMEOUT_S``: unset or empty is the 7-day default."""
    text = (value or "").strip()
    if not text:
        return DEFAULT_MAX_TASK_TIMEOUT_S
    seconds: object
    try:
        seconds = float(text)
    except ValueError:
        seconds = text  # not a number: refused below, as given
    return check_max_task_timeout(ENV_MAX_TASK_TIMEOUT, seconds)


ENV_MAX_RESULT_BYTES: Final = "TASKWARD_MAX_RESULT_BYTES"


def _max_result_bytes(value: str | None) -> int:
    """``TASKWARD_MAX_RESULT_BYTES``: unset or empty is the 1 MiB default (R22)."""
    text = (value or "").strip()
    if not text:
        return DEFAULT_MAX_RESULT_BYTES
    size: object
    try:
        size = int(text)
    except ValueError:
        size = text  # not an integer: refused below, as given
    return check_max_result_bytes(ENV_MAX_RESULT_BYTES, size)


def _allowlist(value: str | None) -> frozenset[str] | None:
    """A comma-separated allowlist; ``*`` anywhere in it allows all (None)."""
    items = _split(value)
    return None if ALLOW_ALL in items else frozenset(items)


@dataclass(frozen=True)
class AdapterConfig:
    """What a deployment allows adapters to run.

    ``command_allowlist``: executables ``command`` may run (bare names or absolute paths); None
    allows any (only ``taskward up``'s local default does this, and says so). ``python_modules``:
    modules whose own functions ``python`` may call by ``module:function``; None allows any.
    ``imports``: modules whose ``@taskward.task`` functions register under their own kinds (and
    are callable through ``python`` too). ``launcher``: the program the launcher kinds run.
    ``workflow_library``: the directory of workflow definitions; without one there is no
    ``workflow`` kind. ``child_env_passthrough``: worker variables (names, ``PREFIX*``) that
    command, launcher and workflow children see beyond the basics (``childenv.child_environment``;
    never the API tokens or other secrets). The defaults allow no command and no module.
    """

    command_allowlist: frozenset[str] | None = frozenset()
    python_modules: frozenset[str] | None = frozenset()
    imports: tuple[str, ...] = ()
    launcher: str = DEFAULT_LAUNCHER
    workflow_library: Path | None = None
    # Worker variables children may see beyond the basics (names or PREFIX* patterns).
    child_env_passthrough: tuple[str, ...] = ()
    # The largest args.timeout_s admission accepts for any kind (R5; TASKWARD_MAX_TASK_TIMEOUT_S).
    max_task_timeout_s: float = DEFAULT_MAX_TASK_TIMEOUT_S
    # The largest JSON text of a python function's return value that is stored (R22; bytes;
    # TASKWARD_MAX_RESULT_BYTES): a larger one fails its attempt (result_not_serializable).
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> AdapterConfig:
        """Read ``TASKWARD_COMMAND_ALLOWLIST``, ``TASKWARD_PYTHON_MODULES`` (comma-separated;
        ``*`` allows all), ``TASKWARD_IMPORTS``, ``TASKWARD_LAUNCHER``,
        ``TASKWARD_WORKFLOW_LIBRARY``, ``TASKWARD_CHILD_ENV_PASSTHROUGH`` and
        ``TASKWARD_MAX_TASK_TIMEOUT_S`` (seconds; default 604800, 7 days) and
        ``TASKWARD_MAX_RESULT_BYTES`` (bytes; default 1048576, 1 MiB); keyword ``overrides``
        win (a CLI's flags)."""
        env = os.environ if environ is None else environ
        library = env.get("TASKWARD_WORKFLOW_LIBRARY", "").strip()
        config = cls(
            command_allowlist=_allowlist(env.get("TASKWARD_COMMAND_ALLOWLIST")),
            python_modules=_allowlist(env.get("TASKWARD_PYTHON_MODULES")),
            imports=_split(env.get("TASKWARD_IMPORTS")),
            launcher=env.get("TASKWARD_LAUNCHER", "").strip() or DEFAULT_LAUNCHER,
            workflow_library=Path(library) if library else None,
            child_env_passthrough=parse_env_passthrough(env.get(ENV_CHILD_ENV_PASSTHROUGH)),
            max_task_timeout_s=_max_task_timeout(env.get(ENV_MAX_TASK_TIMEOUT)),
            max_result_bytes=_max_result_bytes(env.get(ENV_MAX_RESULT_BYTES)),
        )
        return dataclasses.replace(config, **overrides)

    @classmethod
    def allow_all(cls, **overrides: Any) -> AdapterConfig:
        """Any command and any module: ``taskward up``'s local default, which must say so."""
        return dataclasses.replace(cls(command_allowlist=None, python_modules=None), **overrides)

    def unfenced_kinds(self) -> tuple[str, ...]:
        """The kinds that run anything a submitter names (to be announced at start-up)."""
        kinds = []
        if self.command_allowlist is None:
            kinds.append("command")
        if self.python_modules is None:
            kinds.append("python")
        return tuple(kinds)


def _import(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (name == exc.name or name.startswith(exc.name + ".")):
            raise TaskValidationError(
                "imports",
                name,
                "importable modules (on sys.path)",
                message=f"imports names {name!r}, which cannot be imported: {exc}",
            ) from exc
        raise


def build_registry(
    config: AdapterConfig | None = None, *, extra_adapters: Iterable[TaskAdapter] = ()
) -> TaskAdapterRegistry:
    """The built-in adapters, the ``@taskward.task`` functions of ``config.imports`` and
    ``extra_adapters``, in a registry of their own.

    Raises:
        TaskValidationError: an import is missing, two functions claim one kind, a kind
            collides with another or with an alias, or the workflow library is no directory.
    """
    config = config or AdapterConfig()
    registry = TaskAdapterRegistry(max_task_timeout_s=config.max_task_timeout_s)
    passthrough = config.child_env_passthrough
    registry.register(
        CommandAdapter(allowlist=config.command_allowlist, env_passthrough=passthrough)
    )
    max_result_bytes = check_max_result_bytes("max_result_bytes", config.max_result_bytes)
    functions = task_functions(
        (_import(name) for name in config.imports), max_result_bytes=max_result_bytes
    )
    registry.register(
        PythonAdapter(
            modules=config.python_modules, functions=functions, max_result_bytes=max_result_bytes
        )
    )
    for kind in LAUNCHER_KINDS:
        registry.register(
            LauncherAdapter(kind, launcher=config.launcher, env_passthrough=passthrough)
        )
    if config.workflow_library is not None:
        library = Path(config.workflow_library)
        if not library.is_dir():
            raise TaskValidationError("workflow_library", str(library), "an existing directory")
        registry.register(
            WorkflowAdapter(FileWorkflowLibrary(library), env_passthrough=passthrough)
        )
    for function_adapter in functions.values():
        registry.register(function_adapter)
    for adapter in extra_adapters:
        registry.register(adapter)
    return registry

"""Built-in adapters and ``build_registry``: how each process assembles its adapter registry.

There is no module-level registry. A process builds one explicitly from the built-ins plus the
modules named in its configuration (``--import`` / ``TASKWARD_IMPORTS``), the same way in the
CLI, the service and the worker (DESIGN.md "Action kinds and adapters").
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from taskward.adapters.command import CommandAdapter
from taskward.adapters.launcher import LAUNCHER_KINDS, LauncherAdapter
from taskward.adapters.python import PythonAdapter, PythonFunctionAdapter, task, task_functions
from taskward.adapters.workflow import FileWorkflowLibrary, WorkflowAdapter
from taskward.registry import TaskAdapterRegistry

__all__ = [
    "AdapterConfig",
    "CommandAdapter",
    "FileWorkflowLibrary",
    "LauncherAdapter",
    "PythonAdapter",
    "PythonFunctionAdapter",
    "WorkflowAdapter",
    "build_registry",
    "task",
]


def _split(value: str | None) -> tuple[str, ...]:
    return tuple(p.strip() for p in (value or "").replace(";", ",").split(",") if p.strip())


@dataclass(frozen=True)
class AdapterConfig:
    """What a deployment allows adapters to run.

    ``command_allowlist``: executables ``command`` may run (names or absolute paths); None
    allows any (only ``taskward up``'s local default does this, and says so).
    ``python_modules``: modules whose functions ``python`` may call by ``module:function``;
    None allows any. Functions decorated with ``@taskward.task`` in imported modules are
    always callable under their own kind.
    """

    command_allowlist: frozenset[str] | None = frozenset()
    python_modules: frozenset[str] | None = frozenset()
    imports: tuple[str, ...] = ()
    launcher: str = "li"
    workflow_library: Path | None = None
    extra: tuple[object, ...] = field(default=())

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides: object) -> AdapterConfig:
        env = os.environ if environ is None else environ
        allow_commands = _split(env.get("TASKWARD_COMMAND_ALLOWLIST"))
        allow_modules = _split(env.get("TASKWARD_PYTHON_MODULES"))
        library = env.get("TASKWARD_WORKFLOW_LIBRARY")
        values: dict[str, object] = {
            "command_allowlist": None if allow_commands == ("*",) else frozenset(allow_commands),
            "python_modules": None if allow_modules == ("*",) else frozenset(allow_modules),
            "imports": _split(env.get("TASKWARD_IMPORTS")),
            "launcher": env.get("TASKWARD_LAUNCHER") or "li",
            "workflow_library": Path(library) if library else None,
        }
        values.update(overrides)
        return cls(**values)  # type: ignore[arg-type]


def build_registry(
    config: AdapterConfig | None = None, *, extra_adapters: Iterable[object] = ()
) -> TaskAdapterRegistry:
    """The built-in adapters plus the ``@taskward.task`` functions of ``config.imports``."""
    config = config or AdapterConfig()
    registry = TaskAdapterRegistry()
    registry.register(CommandAdapter(allowlist=config.command_allowlist))
    modules = [importlib.import_module(name) for name in config.imports]
    functions = task_functions(modules)
    registry.register(PythonAdapter(modules=config.python_modules, functions=functions))
    for kind in LAUNCHER_KINDS:
        registry.register(LauncherAdapter(kind, launcher=config.launcher))
    if config.workflow_library is not None:
        registry.register(WorkflowAdapter(FileWorkflowLibrary(config.workflow_library)))
    for function_adapter in functions.values():
        registry.register(function_adapter)
    for adapter in extra_adapters:
        registry.register(adapter)  # type: ignore[arg-type]
    return registry

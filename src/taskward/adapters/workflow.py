"""``workflow``: run a versioned definition from a workflow library, checked by content hash.

Registered only where a library is configured. The file-based library keeps definitions as
``<library>/<name>/<version>.json``; ``library_ref`` is ``name@version`` and
``library_content_hash`` must equal ``sha256:`` + the hex digest of the definition file's bytes,
checked at admission and again, on the same bytes that are parsed, before every run. A
definition is ``{"steps": [{"argv": [...], "cwd"?, "env"?, "timeout_s"?}, ...]}``; steps run in
order as argv lists, never through a shell, each with the minimal child environment of
``childenv.child_environment`` plus the step's ``env``, and the first step that does not
complete ends the run with its status. The task's ``args.timeout_s`` bounds the whole run.

The library, not the submitter, decides what runs: task args cannot change a step.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final, Protocol

from taskward.adapters.childenv import validate_env_passthrough
from taskward.adapters.process import (
    KILL_GRACE_S,
    run_process,
    task_args,
    validate_argv,
    validate_process_args,
)
from taskward.errors import TaskValidationError
from taskward.registry import CancellationToken, TaskExecutionResult

_PART: Final = r"[A-Za-z0-9_][A-Za-z0-9_.-]*"
_REF: Final = re.compile(rf"^({_PART})@({_PART})$")
_HASH: Final = re.compile(r"^sha256:[0-9a-f]{64}$")


def content_hash_of(raw: bytes) -> str:
    """The ``library_content_hash`` of a definition's bytes: ``sha256:<hex>``."""
    return "sha256:" + hashlib.sha256(raw).hexdigest()


class WorkflowLibrary(Protocol):
    """Resolves ``library_ref`` to a definition whose bytes hash to ``library_content_hash``."""

    def load(self, library_ref: str, content_hash: str) -> dict[str, Any]:
        """The checked definition; raises TaskValidationError naming the field."""
        ...


def _check_definition(library_ref: str, definition: object) -> dict[str, Any]:
    steps = definition.get("steps") if isinstance(definition, dict) else None
    if not isinstance(definition, dict) or not isinstance(steps, list) or not steps:
        raise TaskValidationError(
            "library_ref", library_ref, "a definition with steps: [{argv: [...]}, ...]"
        )
    for index, step in enumerate(steps):
        field = f"steps[{index}]"
        try:
            if not isinstance(step, dict):
                raise TaskValidationError(field, step, "an object with argv")
            validate_argv(f"{field}.argv", step.get("argv"), require_program=True)
            validate_process_args(step, prefix=field, allow_loader_env=True)
        except TaskValidationError as exc:
            raise TaskValidationError(
                exc.field,
                exc.value,
                exc.allowed,
                message=f"workflow definition {library_ref}: {exc}",
            ) from exc
    return definition


class FileWorkflowLibrary:
    """Definitions as ``<root>/<name>/<version>.json`` files."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    def path(self, library_ref: str) -> Path:
        match = _REF.match(library_ref) if isinstance(library_ref, str) else None
        if not match:
            raise TaskValidationError(
                "library_ref", library_ref, "'name@version' (letters, digits, '_', '.', '-')"
            )
        name, version = match.groups()
        return self.root / name / f"{version}.json"

    def load(self, library_ref: str, content_hash: str) -> dict[str, Any]:
        """The definition, after checking its hash.

        Raises:
            TaskValidationError: a bad ref or hash, a missing or malformed definition, or a
                hash that does not match the definition's bytes.
        """
        path = self.path(library_ref)
        if not isinstance(content_hash, str) or not _HASH.match(content_hash):
            raise TaskValidationError(
                "library_content_hash", content_hash, "'sha256:' + 64 lowercase hex digits"
            )
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise TaskValidationError(
                "library_ref",
                library_ref,
                "a definition present in the workflow library",
                message=f"library_ref {library_ref!r} names no definition in {self.root}: {exc}",
            ) from exc
        actual = content_hash_of(raw)
        if actual != content_hash:
            raise TaskValidationError(
                "library_content_hash",
                content_hash,
                actual,
                message=(
                    f"library_content_hash {content_hash!r} does not match {library_ref} ({actual})"
                ),
            )
        try:
            definition = json.loads(raw)
        except ValueError as exc:
            raise TaskValidationError(
                "library_ref", library_ref, "a definition that is valid JSON"
            ) from exc
        return _check_definition(library_ref, definition)


class WorkflowAdapter:
    """``workflow``: needs ``library_ref`` and ``library_content_hash`` (ADR-0072 D1)."""

    action_kind = "workflow"

    def __init__(
        self,
        library: WorkflowLibrary,
        *,
        kill_grace_s: float = KILL_GRACE_S,
        env_passthrough: Iterable[str] = (),
    ) -> None:
        self.library = library
        self.kill_grace_s = kill_grace_s
        self.env_passthrough = validate_env_passthrough(env_passthrough)

    def validate_args(self, args: dict[str, Any]) -> None:
        timeout = args.get("timeout_s")
        validate_process_args({"timeout_s": timeout})

    def validate_provenance(self, library_ref: str | None, content_hash: str | None) -> None:
        """workflow requires both provenance fields and a definition whose hash matches."""
        self._load(library_ref, content_hash)

    def _load(self, library_ref: str | None, content_hash: str | None) -> dict[str, Any]:
        if library_ref is None:
            raise TaskValidationError("library_ref", None, "'name@version' (required for workflow)")
        if content_hash is None:
            raise TaskValidationError(
                "library_content_hash", None, "'sha256:<hex>' (required for workflow)"
            )
        return self.library.load(library_ref, content_hash)

    async def execute(
        self, task: dict[str, Any], *, cancellation: CancellationToken
    ) -> TaskExecutionResult:
        library_ref = task.get("library_ref")
        try:
            args = task_args(task)
            self.validate_args(args)
            # Checked again on the bytes that run: the file may have changed since admission.
            definition = self._load(library_ref, task.get("library_content_hash"))
        except TaskValidationError as exc:
            return TaskExecutionResult(status="failed", error_detail=str(exc))
        timeout_s: float | None = args.get("timeout_s")
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        evidence: list[dict[str, Any]] = []
        for index, step in enumerate(definition["steps"]):
            step_timeout: float | None = step.get("timeout_s")
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return TaskExecutionResult(
                        status="timed_out",
                        error_detail=f"timed out after {timeout_s}s before step {index}",
                        evidence_refs=evidence,
                        retryable=True,  # a deadline is retryable (R5)
                    )
                step_timeout = remaining if step_timeout is None else min(step_timeout, remaining)
            result = await run_process(
                list(step["argv"]),
                cwd=step.get("cwd"),
                env=step.get("env"),
                timeout_s=step_timeout,
                cancellation=cancellation,
                kill_grace_s=self.kill_grace_s,
                env_passthrough=self.env_passthrough,
            )
            evidence.append(
                {
                    "kind": "workflow_step",
                    "library_ref": library_ref,
                    "index": index,
                    "status": result.status,
                    "exit_code": result.exit_code,
                }
            )
            evidence.extend({**ref, "step": index} for ref in result.evidence_refs)
            if result.status != "completed":
                return TaskExecutionResult(
                    status=result.status,
                    exit_code=result.exit_code,
                    error_detail=f"step {index} {result.status}: {result.error_detail}",
                    evidence_refs=evidence,
                    retryable=result.retryable,
                )
        return TaskExecutionResult(status="completed", exit_code=0, evidence_refs=evidence)

"""``workflow``: run a versioned definition from a workflow library, checked by content hash.

Registered only where a library is configured. The file-based library keeps definitions as
``<library>/<name>/<version>.json``; ``library_ref`` is ``name@version`` and
``library_content_hash`` must equal ``sha256:`` of the definition file's bytes. A definition is
``{"steps": [{"argv": [...]}...]}``; steps run in order as argv lists, never through a shell.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from taskward.adapters.process import run_process
from taskward.errors import TaskValidationError
from taskward.registry import CancellationToken, TaskExecutionResult

_REF = re.compile(r"^([A-Za-z0-9_.-]+)@([A-Za-z0-9_.-]+)$")


class FileWorkflowLibrary:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def path(self, library_ref: str) -> Path:
        match = _REF.match(library_ref)
        if not match:
            raise TaskValidationError("library_ref", library_ref, "'name@version'")
        name, version = match.groups()
        return self.root / name / f"{version}.json"

    def load(self, library_ref: str, content_hash: str) -> dict[str, Any]:
        """The definition, after checking its hash; raises TaskValidationError."""
        path = self.path(library_ref)
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise TaskValidationError("library_ref", library_ref,
                                      "a definition present in the workflow library") from exc
        actual = "sha256:" + hashlib.sha256(raw).hexdigest()
        if actual != content_hash:
            raise TaskValidationError(
                "library_content_hash", content_hash, actual,
                message=f"library_content_hash {content_hash!r} does not match {library_ref}"
                        f" ({actual})")
        definition = json.loads(raw)
        steps = definition.get("steps") if isinstance(definition, dict) else None
        if not isinstance(steps, list) or not all(
            isinstance(s, dict) and isinstance(s.get("argv"), list) and s["argv"] for s in steps
        ):
            raise TaskValidationError("library_ref", library_ref,
                                      "a definition with steps: [{argv: [...]}, ...]")
        return definition


class WorkflowAdapter:
    action_kind = "workflow"

    def __init__(self, library: FileWorkflowLibrary) -> None:
        self.library = library

    def validate_args(self, args: dict[str, Any]) -> None:
        return None

    def validate_provenance(self, library_ref: str | None, content_hash: str | None) -> None:
        """workflow requires both provenance fields and a definition whose hash matches."""
        if library_ref is None:
            raise TaskValidationError("library_ref", None, "'name@version' (required for workflow)")
        if content_hash is None:
            raise TaskValidationError("library_content_hash", None,
                                      "'sha256:<hex>' (required for workflow)")
        self.library.load(library_ref, content_hash)

    async def execute(
        self, task: dict[str, Any], *, cancellation: CancellationToken
    ) -> TaskExecutionResult:
        try:
            definition = self.library.load(task["library_ref"], task["library_content_hash"])
        except (TaskValidationError, TypeError, KeyError, ValueError) as exc:
            return TaskExecutionResult(status="failed", error_detail=str(exc))
        evidence: list[dict[str, Any]] = []
        for index, step in enumerate(definition["steps"]):
            result = await run_process(
                [str(a) for a in step["argv"]], cwd=step.get("cwd"),
                timeout_s=step.get("timeout_s"), cancellation=cancellation)
            evidence.append({"kind": "workflow_step", "index": index, "status": result.status,
                             "exit_code": result.exit_code})
            if result.status != "completed":
                return TaskExecutionResult(
                    status=result.status, exit_code=result.exit_code,
                    error_detail=f"step {index} {result.status}: {result.error_detail}",
                    evidence_refs=evidence)
        return TaskExecutionResult(status="completed", exit_code=0, evidence_refs=evidence)

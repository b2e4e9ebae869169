"""OpenTelemetry tracing (``taskward[otel]``, issue 28): admission's span and the W3C trace
context stored with a task (``schedule_runs.trace_context``), and the run's span that a worker
continues from it, ended by the terminal transition. Imports nothing of taskward's.

taskward never imports OpenTelemetry itself. It traces once the application has imported
``opentelemetry.trace`` and set a tracer provider (the SDK's, or the auto-instrumentation's);
until the API is imported, every function here is one look-up in ``sys.modules`` and a no-op:
no import cost, no context parsing, nothing stored. With the API imported and no provider set
(the API's no-op tracer), no span is started; admission still stores the caller's active span
context, if it has one, so a process that only propagates hands its trace on to the worker.

Known limits: only W3C ``traceparent``/``tracestate`` travel with the task (no baggage); a
command adapter's child process is not given the context.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from functools import cache, lru_cache
from types import TracebackType
from typing import Any, Final

# The module whose presence says the application may trace; never imported here.
API_MODULE: Final = "opentelemetry.trace"
TRACER_NAME: Final = "taskward"
ADMIT_SPAN: Final = "taskward.admit"
RUN_SPAN: Final = "taskward.run"  # + " <kind>"
# A stored context is at most this long: a traceparent is 55 characters, and W3C asks
# propagators to pass on at least 512 of tracestate; a longer tracestate is dropped, not cut.
MAX_TRACE_CONTEXT_CHARS: Final = 1024
MAX_STATUS_DETAIL: Final = 200
# The terminal states (and retry_wait) that end a run's span with an error status.
FAILED_STATES: Final = frozenset({"failed", "timed_out", "retry_wait"})

_NOT_RUNNING: Final = nullcontext()


@lru_cache(maxsize=8)
def _tracer_of(provider: Any) -> Any | None:
    """The tracer of a configured ``provider``; None for the API's proxy (no provider set) or
    no-op one. Answered once per provider (an ``isinstance`` on the API's abstract classes is
    not free), and a process's provider, once set, never changes."""
    api = sys.modules[API_MODULE]
    if isinstance(provider, (api.ProxyTracerProvider, api.NoOpTracerProvider)):
        return None
    return provider.get_tracer(TRACER_NAME)


@cache
def _provider_in_environment() -> bool:
    return "OTEL_PYTHON_TRACER_PROVIDER" in os.environ


def _tracer(api: Any) -> Any | None:
    """The tracer of the configured provider; None while none is (the API's proxy or no-op).

    ``get_tracer_provider()`` looks in ``os.environ`` on every call until a provider is set,
    which cost more than the rest of a run's tracing together; so while the API's global holds
    no provider, and no provider is named in the environment (read once), the answer is None
    without asking. An API without that global is asked every time."""
    provider = getattr(api, "_TRACER_PROVIDER", api)
    if provider is None:
        if not _provider_in_environment():
            return None
        provider = api.get_tracer_provider()
    elif provider is api:
        provider = api.get_tracer_provider()
    return _tracer_of(provider)


def is_tracing() -> bool:
    """Whether a tracer provider is configured (spans are started)."""
    api = sys.modules.get(API_MODULE)
    return api is not None and _tracer(api) is not None


@cache
def _propagator() -> Any:
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator()


def _current_carrier() -> dict[str, str] | None:
    """The current context's W3C headers (``traceparent``, ``tracestate``), or None when no
    span context is current. The API must be imported."""
    carrier: dict[str, str] = {}
    _propagator().inject(carrier)
    return carrier if "traceparent" in carrier else None


def _current_trace_context() -> str | None:
    """The current context's W3C headers as stored with a task (JSON text), or None."""
    carrier = _current_carrier()
    if carrier is None:
        return None
    text = json.dumps(carrier, separators=(",", ":"), sort_keys=True)
    if len(text) > MAX_TRACE_CONTEXT_CHARS:
        text = json.dumps({"traceparent": carrier["traceparent"]}, separators=(",", ":"))
    return text


def child_trace_env() -> dict[str, str]:
    """The current span's W3C context for a child process's environment: ``TRACEPARENT`` (and
    ``TRACESTATE`` when there is one), the names the OpenTelemetry environment-carrier
    convention gives them, so a ``command`` task's program continues the run's trace. Empty
    until the application imported OpenTelemetry, or outside a recording span's context."""
    carrier = _current_carrier() if API_MODULE in sys.modules else None
    if carrier is None:
        return {}
    env = {"TRACEPARENT": carrier["traceparent"]}
    state = carrier.get("tracestate", "")
    if state and len(state) <= MAX_TRACE_CONTEXT_CHARS:
        env["TRACESTATE"] = state
    return env


def parent_context(stored: object) -> Any:
    """The OpenTelemetry context a stored ``trace_context`` names (an empty one, so the run is a
    root span, when there is none or it is not a JSON object of W3C headers). Needs the API."""
    carrier: Mapping[str, Any] = {}
    if isinstance(stored, str) and 0 < len(stored) <= MAX_TRACE_CONTEXT_CHARS:
        try:
            loaded = json.loads(stored)
        except ValueError:
            loaded = None
        if isinstance(loaded, dict):
            carrier = {k: v for k, v in loaded.items() if isinstance(v, str)}
    return _propagator().extract(carrier)


# -- admission ----------------------------------------------------------------------------------


class Admitting:
    """Admission's span, entered around the insert (``admission_span``): ``trace_context`` is
    what admission stores with the task (None: nothing to store); ``admitted`` records each
    task's answer, set on the span when it ends. Without a provider the shared ``NOT_TRACED``
    (or a context-only instance): nothing is recorded."""

    __slots__ = (
        "_attributes",
        "_count",
        "_created",
        "_first",
        "_scope",
        "_span",
        "_tracer",
        "trace_context",
    )

    def __init__(
        self,
        trace_context: str | None = None,
        tracer: Any = None,
        attributes: dict[str, Any] | None = None,
    ) -> None:
        self.trace_context = trace_context
        self._tracer = tracer
        self._attributes = attributes
        self._scope: AbstractContextManager[Any] | None = None
        self._span: Any = None
        self._count = 0
        self._created = 0
        self._first: tuple[str, bool] | None = None

    @property
    def recording(self) -> bool:
        """Whether ``admitted`` records anything (callers skip it otherwise)."""
        return self._span is not None

    def __enter__(self) -> Admitting:
        if self._tracer is not None:
            api = sys.modules[API_MODULE]
            self._scope = self._tracer.start_as_current_span(
                ADMIT_SPAN, kind=api.SpanKind.PRODUCER, attributes=self._attributes
            )
            self._span = self._scope.__enter__()
            self.trace_context = _current_trace_context()
        return self

    def admitted(self, task_id: str, created: bool) -> None:
        """One task's answer: its id, and whether this admission inserted it."""
        if self._span is None:
            return
        self._count += 1
        self._created += created
        if self._first is None:
            self._first = (task_id, created)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        scope, span = self._scope, self._span
        if scope is None:
            return None
        self._scope = self._span = None
        if self._first is not None and self._count == 1:
            task_id, created = self._first
            span.set_attribute("taskward.task.id", task_id)
            span.set_attribute("messaging.message.id", task_id)
            span.set_attribute("taskward.admission.result", "created" if created else "existing")
        elif self._count:
            span.set_attribute("taskward.admission.count", self._count)
            span.set_attribute("taskward.admission.created", self._created)
        return scope.__exit__(exc_type, exc, tb)


NOT_TRACED: Final = Admitting()


def admission_span(
    source: str, *, kind: str | None = None, key: str | None = None, count: int = 1
) -> Admitting:
    """A span for one admission call (``kind`` and ``key`` of its one application, or ``count``
    applications), whose W3C context admission stores with the tasks it inserts. Without a
    provider: the caller's active span context, if any, and no span; without the API: nothing.
    """
    api = sys.modules.get(API_MODULE)
    if api is None:
        return NOT_TRACED
    tracer = _tracer(api)
    if tracer is None:
        current = api.get_current_span()
        if current is api.INVALID_SPAN or not current.get_span_context().is_valid:
            return NOT_TRACED
        return Admitting(trace_context=_current_trace_context())
    attributes: dict[str, Any] = {
        "messaging.system": "taskward",
        "messaging.operation.type": "create",
        "taskward.admission.source": source,
    }
    if kind is not None:
        attributes["taskward.task.kind"] = kind
    if key is not None:
        attributes["taskward.task.key"] = key
    if count != 1:
        attributes["taskward.admission.count"] = count
    return Admitting(tracer=tracer, attributes=attributes)


# -- the run ------------------------------------------------------------------------------------


def start_run(row: Mapping[str, Any], attempt: int, lease_id: str, worker_id: str) -> Any | None:
    """The span of one run of a claimed ``row`` (its ``schedule_runs`` columns), a child of the
    context stored at admission (a root span without one); not current yet (``running``), ended
    by ``end_run``. None, without parsing anything, when no provider is configured."""
    api = sys.modules.get(API_MODULE)
    if api is None:
        return None
    tracer = _tracer(api)
    if tracer is None:
        return None
    kind = row["action_kind"]
    return tracer.start_span(
        f"{RUN_SPAN} {kind}",
        context=parent_context(row.get("trace_context")),
        kind=api.SpanKind.CONSUMER,
        attributes={
            "messaging.system": "taskward",
            "messaging.operation.type": "process",
            "messaging.message.id": row["id"],
            "taskward.task.id": row["id"],
            "taskward.task.kind": kind,
            "taskward.task.attempt": attempt,
            "taskward.lease.id": lease_id,
            "taskward.worker.id": worker_id,
        },
    )


def running(span: Any | None) -> AbstractContextManager[Any]:
    """``span`` made current for the adapter's execution (an exception it raises is recorded on
    it); the span stays open for the terminal transition (``end_run``)."""
    if span is None:
        return _NOT_RUNNING
    api = sys.modules[API_MODULE]
    scope: AbstractContextManager[Any] = api.use_span(span, end_on_exit=False)
    return scope


def end_run(
    span: Any,
    *,
    state: str | None,
    reason: str | None = None,
    summary: str | None = None,
    applied: bool = True,
    adapter_status: str | None = None,
    exit_code: int | None = None,
) -> None:
    """End a run's span with its terminal transition: the status the task is in afterwards and
    the transition's reason; an error status for a failed attempt (``FAILED_STATES``) or a
    refused acknowledgement (the lease was no longer this worker's: ``applied`` False)."""
    api = sys.modules[API_MODULE]
    if state is not None:
        span.set_attribute("taskward.task.status", state)
    if reason is not None:
        span.set_attribute("taskward.task.reason", reason)
    if adapter_status is not None:
        span.set_attribute("taskward.adapter.status", adapter_status)
    if exit_code is not None:
        span.set_attribute("taskward.adapter.exit_code", exit_code)
    span.set_attribute("taskward.ack.applied", applied)
    if not applied:
        detail = f"acknowledgement refused: the task is {state or 'no longer leased'}"
        span.set_status(api.Status(api.StatusCode.ERROR, detail))
    elif state in FAILED_STATES:
        detail = reason or state
        if summary:
            detail = f"{detail}: {summary}"
        span.set_status(api.Status(api.StatusCode.ERROR, detail[:MAX_STATUS_DETAIL]))
    span.end()


__all__ = [
    "NOT_TRACED",
    "Admitting",
    "admission_span",
    "end_run",
    "is_tracing",
    "parent_context",
    "running",
    "start_run",
]

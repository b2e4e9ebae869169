"""The ADR-0037 D6 conformance suite, kept importable here (``taskward.testing``); it lives in
``taskward.host.conformance``: the harness, the recording wrappers, the ten cases, the optional
ports' cases and ``run_conformance``. See that package for usage."""

from taskward.host.conformance import (
    CONFORMANCE_CASES,
    OPTIONAL_CASES,
    CallLog,
    CaseReport,
    ConformanceCase,
    ConformanceFailure,
    ConformanceHarness,
    ConformanceSession,
    PortCall,
    QueueState,
    RecordingRenewingSource,
    RecordingSummaryStore,
    RecordingTaskSource,
    SummaryOutage,
    SummaryState,
    run_conformance,
    wait_until,
)

__all__ = [
    "CONFORMANCE_CASES",
    "CallLog",
    "CaseReport",
    "ConformanceCase",
    "ConformanceFailure",
    "ConformanceHarness",
    "ConformanceSession",
    "OPTIONAL_CASES",
    "PortCall",
    "QueueState",
    "RecordingRenewingSource",
    "RecordingSummaryStore",
    "RecordingTaskSource",
    "SummaryOutage",
    "SummaryState",
    "run_conformance",
    "wait_until",
]

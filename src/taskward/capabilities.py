"""Capability classes: eligibility filters, affinity orders, serialization blocks (ADR-0071 D5).

Capabilities route and order; they never authorize. Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

DEFAULT_CAPABILITY_CLASS: Final = "eligibility"

CAPABILITY_CLASSES: dict[str, str] = {
    "gpu-exclusive": "serialization",
    "warmed-cache": "affinity",
}


def capability_class(token: str) -> str:
    """The class of ``token``; unknown tokens are eligibility tokens."""
    return CAPABILITY_CLASSES.get(token, DEFAULT_CAPABILITY_CLASS)


def normalize_capabilities(tokens: Iterable[str] | None) -> list[str]:
    """The stored and hashed form: sorted and de-duplicated (R8)."""
    return sorted(set(tokens or ()))


def worker_can_serve(
    required_capabilities: Iterable[str] | None,
    advertised_capabilities: Iterable[str] | None,
) -> bool:
    """True when every eligibility and serialization token is advertised; affinity never filters."""
    advertised = set(advertised_capabilities or ())
    return all(
        token in advertised
        for token in (required_capabilities or ())
        if capability_class(token) != "affinity"
    )


def affinity_score(
    required_capabilities: Iterable[str] | None,
    advertised_capabilities: Iterable[str] | None,
) -> int:
    """How many of the task's affinity tokens the worker advertises (higher sorts first)."""
    advertised = set(advertised_capabilities or ())
    return sum(
        1
        for token in set(required_capabilities or ())
        if capability_class(token) == "affinity" and token in advertised
    )


def serialization_tokens(required_capabilities: Iterable[str] | None) -> list[str]:
    return sorted(
        {t for t in (required_capabilities or ()) if capability_class(t) == "serialization"}
    )


def host_scoped_concurrency_key(
    host: str,
    required_capabilities: Iterable[str] | None,
) -> str | None:
    """``<host>:<token+token...>`` over sorted serialization tokens, or None when there are none."""
    tokens = serialization_tokens(required_capabilities)
    if not tokens:
        return None
    return f"{host}:{'+'.join(tokens)}"

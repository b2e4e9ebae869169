from __future__ import annotations

from taskward.capabilities import (
    affinity_score,
    capability_class,
    host_scoped_concurrency_key,
    normalize_capabilities,
    worker_can_serve,
)


def test_unknown_tokens_are_eligibility_tokens() -> None:
    assert capability_class("python3.12") == "eligibility"


def test_eligibility_and_serialization_must_be_advertised() -> None:
    assert worker_can_serve(["linux", "gpu-exclusive"], ["linux", "gpu-exclusive", "x"])
    assert not worker_can_serve(["linux", "gpu-exclusive"], ["linux"])
    assert not worker_can_serve(["linux"], None)
    assert worker_can_serve(None, None)


def test_affinity_never_filters_but_scores() -> None:
    assert worker_can_serve(["warmed-cache"], [])
    assert affinity_score(["warmed-cache"], ["warmed-cache"]) == 1
    assert affinity_score(["warmed-cache"], []) == 0
    assert affinity_score(["linux"], ["linux"]) == 0


def test_concurrency_key_folds_sorted_serialization_tokens() -> None:
    assert host_scoped_concurrency_key("h1", ["linux", "warmed-cache"]) is None
    assert host_scoped_concurrency_key("h1", ["gpu-exclusive", "linux"]) == "h1:gpu-exclusive"


def test_normalized_capabilities_are_sorted_and_unique() -> None:
    assert normalize_capabilities(["b", "a", "b"]) == ["a", "b"]
    assert normalize_capabilities(None) == []

"""Reading a ``/metrics`` exposition in tests: parsed by ``prometheus_client.parser``, never by
string matching, so a test asserts values, not formatting."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> tuple[Samples, dict[str, str]]:
    """Every sample by (name, labels), and every family's type by its name."""
    samples: Samples = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples, types


def value(samples: Samples, name: str, **labels: str) -> float | None:
    """The sample ``name{labels}``, None when the exposition has none."""
    return samples.get((name, frozenset(labels.items())))

"""Shared by the mutant plugins: under a mutant, the model test reports the first failure it
finds without shrinking it (the run only needs to fail; shrinking would spend the budget)."""

from __future__ import annotations

import pytest
from hypothesis import Phase, settings

MUTANT_PROFILE = "taskward-model-mutant"


def pytest_configure(config: pytest.Config) -> None:
    """After tests/conftest.py registered the model profile: derive the mutant one from it."""
    settings.register_profile(
        MUTANT_PROFILE,
        settings.get_profile("taskward-model"),
        phases=[Phase.explicit, Phase.reuse, Phase.generate],
    )

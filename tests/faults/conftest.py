"""The fault scenarios' long forms (``chaos`` marker) run only with ``TASKWARD_CHAOS=1``."""

from __future__ import annotations

import pytest

from tests.faults.support import CHAOS


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="a long-form fault scenario: set TASKWARD_CHAOS=1 to run it")
    for item in items:
        if item.get_closest_marker("chaos") is None:
            continue
        if CHAOS:
            item.add_marker(pytest.mark.timeout(1800))
        else:
            item.add_marker(skip)

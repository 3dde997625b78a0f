"""Test ordering shared by the whole suite."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Start the tests that run for minutes first (stable otherwise).

    ``make test`` runs two test processes; a multi-minute test started last would run alone
    at the end, so the suite would take its duration on top of everything else.
    """
    items.sort(key=lambda item: item.get_closest_marker("minutes") is None)

"""Test ordering and hypothesis settings shared by the whole suite."""

from __future__ import annotations

import logging
import os

import pytest
from hypothesis import settings

# CI must be reproducible: hypothesis draws the same examples on every run (a new failing
# example then comes from a code change, not from luck); `--hypothesis-seed` still varies it
# no per-example deadline: CI may share its 2 cores, and a slow example is not a wrong one
settings.register_profile("deterministic", derandomize=True, deadline=None)
settings.load_profile("deterministic")

# A Kafka client still running after its test (a client thread of a test that failed, a
# producer retrying against a broker fixture already stopped) logs a line per retry. During a
# test pytest captures them, shown with that test if it fails; outside one, with no handler
# anywhere, `logging.lastResort` writes each to the terminal: thousands of lines ahead of the
# failure list under xdist, whose test processes outlive their sessions. A handler of their own
# keeps them off the terminal and still lets them propagate to pytest's capture.
logging.getLogger("aiokafka").addHandler(logging.NullHandler())

# An open market asks a proof of work for each opening (about a second of a core): the tests'
# markets (`serve`, `demo`, workers they start) ask none unless a test asks for it
os.environ.setdefault("EMARKET_OPENING_WORK", "0")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Start each test that runs for minutes (chaos, soak) first in its own test process.

    ``make test`` runs two test processes (pytest-xdist, ``--dist worksteal``), which first
    hand each process a contiguous share of the collection; a long test placed at the start of
    a share starts at once, beside the others, instead of after them or behind another long
    one. Without xdist the long tests simply go first. The order is stable otherwise.
    """
    longs = [i for i in items if i.get_closest_marker("minutes") is not None]
    rest = [i for i in items if i.get_closest_marker("minutes") is None]
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    sizes, remaining = [], len(items)
    for k in range(workers):  # the shares worksteal hands out, in order
        sizes.append(remaining // (workers - k))
        remaining -= sizes[-1]
    ordered: list[pytest.Item] = []
    extra = longs[workers:]  # more long tests than processes: the first share starts with them
    for k, size in enumerate(sizes):
        share = ([longs[k]] if k < len(longs) else []) + (extra if k == 0 else [])
        while len(share) < size and rest:
            share.append(rest.pop(0))
        ordered += share
    items[:] = ordered + rest

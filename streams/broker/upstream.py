"""The libraries' private code our boundary modules rely on, recorded so an upgrade is reviewed.

Two modules touch the insides of third-party libraries, and nothing else in the tree does
(``tests/test_faust_boundary.py`` scans ``streams``, ``market`` and ``bench`` for it):
:mod:`streams.worker.faust_internals` (the worker's patches and private reads of Faust, mode and
aiokafka) and :mod:`streams.broker.kafka_internals` (aiokafka's, for the clients and the broker
tools). Each lists in its ``UPSTREAM`` the functions it replaces, wraps, copies, overrides or
relies on; the test hashes their installed source and fails, saying what to review, when one
differs from the source reviewed for the versions pinned here (:data:`PINNED`).
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
from dataclasses import dataclass
from typing import Any

__all__ = ["PINNED", "Upstream", "source_sha256"]

PINNED = {"faust-streaming": "0.15.3", "aiokafka": "0.14.0", "mode-streaming": "0.7.1"}
"""The versions whose internals the boundary modules were written against (pinned in
pyproject.toml)."""


@dataclass(frozen=True)
class Upstream:
    """One upstream function a boundary module replaces, wraps, copies, overrides, bypasses or
    calls.

    Attributes
    ----------
    dist : str
        The distribution that ships it: its recorded source hash is for that one's pinned version.
    module, qualname : str
        Where it is defined.
    use : str
        What we do with it: ``replaced``, ``wrapped``, ``copied``, ``overridden``, ``bypassed``,
        or ``relied on`` (a private method we call, or code that gives a private attribute we
        read or write its meaning).
    by : str
        The function or class of the boundary module that depends on it.
    """

    dist: str
    module: str
    qualname: str
    use: str
    by: str

    @property
    def target(self) -> str:
        """``module:qualname``, the key of its recorded hash."""
        return f"{self.module}:{self.qualname}"

    def source(self) -> str:
        """Its source as installed (the original's, when a boundary module has patched it)."""
        obj: Any = importlib.import_module(self.module)
        for part in self.qualname.split("."):
            obj = getattr(obj, part)
        return inspect.getsource(inspect.unwrap(obj))


def source_sha256(source: str) -> str:
    """The hash recorded for an upstream function's source (``tests/test_faust_boundary.py``)."""
    return hashlib.sha256(source.encode("utf-8")).hexdigest()

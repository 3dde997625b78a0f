"""Times as people read them: the wire carries Unix milliseconds, people read UTC.

Every time a person reads is ISO 8601 in UTC (``2026-12-06T10:20:38Z``, with ``.123`` when the
milliseconds are not zero); machines (``--json``, the events) keep the integer milliseconds.
"""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["utc_text"]


def utc_text(ms: int) -> str:
    """``1765016438123`` → ``2025-12-06T10:20:38.123Z``; a time no calendar holds (beyond year
    9999) is said in milliseconds."""
    try:
        when = datetime.fromtimestamp(ms // 1000, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return f"{ms} ms (Unix)"
    frac = f".{ms % 1000:03d}" if ms % 1000 else ""
    return when.strftime("%Y-%m-%dT%H:%M:%S") + frac + "Z"

"""Histograms on the client side: reading a seller's counts, naming a buyer's keys.

A ``strings`` histogram stream releases keys as their public 62-bit hash
(:func:`market.histogram_chain.string_key`), never as text: showing a key's text only when it is
in the data would tell it apart from the keys with a zero count that the noise lets through. A
buyer names the keys it knows with :func:`named`; the others stay numbers.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from market.histogram_chain import string_key

from ..wire.counts import count_problem

__all__ = ["describe_named", "key_of", "named", "read_counts"]


def key_of(name: str) -> str:
    """The key a ``strings`` stream releases for ``name`` (decimal text of its 62-bit hash)."""
    return str(string_key(name))


def named(release: Any, names: Iterable[str]) -> tuple[dict[str, float], int]:
    """The noisy counts of a histogram release by the names in ``names`` it shows, and how many
    of its keys none of them names (keys with a zero count, or names not listed)."""
    by_key = {key_of(n): n for n in names}
    keys = release.keys or []
    out = {by_key[k]: v for k, v in zip(keys, release.values, strict=True) if k in by_key}
    return out, len(keys) - len(out)


def describe_named(release: Any, names: Iterable[str]) -> str:
    """One line: the named counts of a release, largest first, and how many keys are unnamed."""
    counts, unnamed = named(release, names)
    shown = ", ".join(f"{n} {v:g}" for n, v in sorted(counts.items(), key=lambda kv: -kv[1]))
    more = f" (+{unnamed} unnamed key{'s' if unnamed != 1 else ''})" if unnamed else ""
    return f"{release.value_id} at level {release.level:g}: {shown or 'no named key'}{more}"


def read_counts(path: str) -> dict[str, float]:
    """A histogram from a file: a JSON object ``{key: count}``, or CSV rows ``key,count`` (a
    first row whose count holds no digit is a header). A byte-order mark is ignored.

    Raises
    ------
    ValueError
        Naming the file and the row or key that is wrong: a repeated key, a count that is not
        a finite number, negative or fractional (:mod:`streams.wire.counts`), a JSON file that
        is not one object, or no count at all.
    """
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not text (UTF-8): expected CSV or JSON counts") from None
    as_json = path.lower().endswith(".json") or text.lstrip().startswith(("{", "["))
    out = _json_counts(path, text) if as_json else _csv_counts(path, text)
    if not out:
        raise ValueError(f"{path} holds no counts")
    return out


def _json_counts(path: str, text: str) -> dict[str, float]:
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for k, v in items:
            if k in seen:
                raise ValueError(f"{path}: key {k!r} appears twice")
            seen[k] = v
        return seen

    try:
        raw = json.loads(text, object_pairs_hook=pairs)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not a JSON object of counts ({exc})") from None
    if not isinstance(raw, dict):
        raise ValueError(
            f"{path}: a JSON file of counts is one object {{key: count}}, "
            f"not a {type(raw).__name__}"
        )
    return {str(k): _count(v, f"{path} key {k!r}") for k, v in raw.items()}


def _csv_counts(path: str, text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for n, row in enumerate(csv.reader(io.StringIO(text)), 1):
        if not row or not "".join(row).strip():
            continue
        if len(row) != 2:
            raise ValueError(f"{path} row {n}: expected key,count; got {len(row)} fields")
        key, count = row[0].strip(), row[1].strip()
        if n == 1 and not any(ch.isdigit() for ch in count):
            continue  # a header
        if key in out:
            raise ValueError(f"{path} row {n}: key {key!r} appears twice")
        out[key] = _count(count, f"{path} row {n}")
    return out


def _count(v: Any, where: str) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: count {v!r} is not a number") from None
    if isinstance(v, bool) or not math.isfinite(x):
        raise ValueError(f"{where}: count {v!r} is not a finite number")
    bad = count_problem([x])
    if bad is not None:
        raise ValueError(
            f"{where}: count {v!r} {bad[1]} (a histogram counts occurrences: "
            "whole numbers, 0 or more)"
        )
    return x

"""The market's domain records are each declared once, by the module their invariant lives in.

A record declared twice drifts: a bound added to one declaration and not the other, a receipt
field the worker writes and the wire model refuses. So each record below has one class, and no
other class of ``streams``, ``market`` or ``bench`` has its name or declares most of its fields
(a copy of it under another name, mapped field by field into it).

* ``Limits`` (``streams.core.context``): the bounds the core enforces; the worker's settings
  carry one, filled from the environment.
* ``Receipt`` (``market.receipts``): a purchase's receipt, whose fields and signed bytes
  (docs/protocol.md §11) are defined there; the wire event carries one with its signature.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("streams", "market", "bench")
RECORDS = {"Limits": "streams/core/context.py", "Receipt": "market/receipts.py"}


def _classes() -> list[tuple[str, ast.ClassDef]]:
    """Every class of the tree, with the file it is in."""
    return [
        (str(path.relative_to(ROOT)), node)
        for d in SCANNED
        for path in sorted((ROOT / d).rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
    ]


def _fields(node: ast.ClassDef) -> set[str]:
    """The names a class body declares with a type: a dataclass's or a model's fields."""
    return {
        item.target.id
        for item in node.body
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
    }


def second_declarations(classes: list[tuple[str, ast.ClassDef]]) -> list[str]:
    """Classes that declare a record again: its name, or more than half of its fields."""
    owners = {
        name: _fields(node)
        for where, node in classes
        for name, home in RECORDS.items()
        if (where, node.name) == (home, name)
    }
    assert set(owners) == set(RECORDS), f"a record is not where RECORDS says: {RECORDS}"
    found = []
    for where, node in classes:
        for name, home in RECORDS.items():
            if (where, node.name) == (home, name):
                continue
            shared = _fields(node) & owners[name]
            if node.name == name or len(shared) > len(owners[name]) / 2:
                found.append(
                    f"{where}:{node.lineno} class {node.name} declares {name} again "
                    f"({len(shared)} of its {len(owners[name])} fields): use {home}'s"
                )
    return found


def test_each_domain_record_is_declared_once() -> None:
    found = second_declarations(_classes())
    assert not found, "\n".join(found)


def test_a_second_declaration_is_found() -> None:
    copy = ast.parse(
        "class Limits:\n    x: int = 1\n"
        "class Bounds:\n    max_holders: int = 1\n    max_accounts: int = 2\n"
        "    max_streams: int = 3\n    max_histogram_streams: int = 4\n"
        "    max_streams_per_seller: int = 5\n    max_histogram_streams_per_seller: int = 6\n"
        "    max_openings_per_minute: int = 7\n    max_quotes_per_minute: int = 8\n"
        "    openings: str = 'open'\n    max_message_bytes: int = 9\n"
    )
    extra = [("bench/copy.py", n) for n in copy.body if isinstance(n, ast.ClassDef)]
    found = second_declarations([*_classes(), *extra])
    assert [f.split(" declares")[0] for f in found if f.startswith("bench/copy.py")] == [
        "bench/copy.py:1 class Limits",
        "bench/copy.py:3 class Bounds",
    ]

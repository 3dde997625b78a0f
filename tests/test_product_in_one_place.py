"""A product kind lives in one place: its module under ``streams/core/products/`` and its wire
section under ``streams/wire/products/``; nothing else in ``streams`` branches on the kind.

A branch on the product kind elsewhere is a place the next product has to find and extend (and
one it silently falls through when it is missed). So the scan below reads every module of
``streams`` outside the two packages and refuses, wherever it appears:

* a comparison involving a ``.product`` attribute (or a ``product`` name), or a product's name
  (other than ``values``, a word with other meanings) as a text;
* a ``match`` on a ``.product``;
* a lookup keyed by a ``.product`` (``table[reg.product]``, ``table.get(reg.product)``);
* ``isinstance``/``issubclass`` with a product class or a product's wire section;
* a read of a registration field only one product has (``tree_height``, ``histogram``: each
  section's :attr:`~streams.wire.products.base.ProductFields.field`), plain or by ``getattr``.

The exceptions are listed in :data:`ALLOWED`, each with why.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from collections.abc import Iterator
from pathlib import Path
from typing import get_args

import streams.core.products as core_products
import streams.wire.products as wire_products
from streams.core.products import PRODUCTS, Product
from streams.wire.events import Product as WireProduct
from streams.wire.products import SECTIONS, ProductFields

ROOT = Path(__file__).resolve().parents[1]
HOMES = ("streams/core/products/", "streams/wire/products/")
ALLOWED = {
    ("streams/clients/commands/seller.py", "_product"): "the CLI's flags of each product "
    "(--running-totals, --histogram) are read into its registration fields there",
}
"""(file, function) → why it may name a product's fields."""


def _product_classes() -> set[str]:
    """The names of every product class and wire section."""
    modules = [
        importlib.import_module(f"{package.__name__}.{info.name}")
        for package in (core_products, wire_products)
        for info in pkgutil.iter_modules(package.__path__)
    ]
    return {
        name
        for m in (core_products, wire_products, *modules)
        for name, cls in inspect.getmembers(m, inspect.isclass)
        if issubclass(cls, Product | ProductFields)
    }


NAMES = set(SECTIONS) - {"values"}
FIELDS = {s.field for s in SECTIONS.values() if s.field is not None}
CLASSES = _product_classes()


def _is_product(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "product") or (
        isinstance(node, ast.Name) and node.id == "product"
    )


def _why(node: ast.AST) -> str | None:
    """What kind of product branch ``node`` is, or ``None``."""
    if isinstance(node, ast.Compare):
        operands = [node.left, *node.comparators]
        if any(_is_product(o) for o in operands):
            return "compares a product"
        if any(isinstance(o, ast.Constant) and o.value in NAMES for o in operands):
            return "compares with a product's name"
    if isinstance(node, ast.Match) and _is_product(node.subject):
        return "matches a product"
    if isinstance(node, ast.Subscript) and _is_product(node.slice):
        return "looks up by product"
    if isinstance(node, ast.Call):
        return _why_call(node)
    if isinstance(node, ast.Attribute) and node.attr in FIELDS:
        return f"reads the product field {node.attr!r}"
    return None


def _why_call(node: ast.Call) -> str | None:
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr == "get" and node.args[:1]:
        return "looks up by product" if _is_product(node.args[0]) else None
    if not isinstance(func, ast.Name) or len(node.args) < 2:
        return None
    if func.id in ("isinstance", "issubclass"):
        named = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
        named |= {n.attr for n in ast.walk(node.args[1]) if isinstance(n, ast.Attribute)}
        if named & CLASSES:
            return "tests for a product class"
    arg = node.args[1]
    if func.id in ("getattr", "hasattr") and isinstance(arg, ast.Constant) and arg.value in FIELDS:
        return f"reads the product field {arg.value!r}"
    return None


def branches(source: str, path: str) -> Iterator[str]:
    """Every product branch in ``source`` (the module at ``path``), outside :data:`ALLOWED`."""

    def walk(node: ast.AST, function: str) -> Iterator[str]:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            function = node.name
        why = _why(node)
        if why is not None and (path, function) not in ALLOWED:
            yield f"{path}:{getattr(node, 'lineno', '?')}: {why}: {ast.unparse(node)[:70]}"
        for child in ast.iter_child_nodes(node):
            yield from walk(child, function)

    yield from walk(ast.parse(source), "")


def test_the_scan_sees_every_kind_of_branch() -> None:
    source = """
def f(reg, x, spec, args):
    a = reg.product == "histogram"
    b = kind != "running_totals"
    c = {"histogram": 1}.get(reg.product)
    d = TABLE[reg.product]
    e = isinstance(x, Histograms) or issubclass(x, (int, products.Totals))
    g = reg.tree_height + spec.histogram
    h = getattr(reg, "tree_height")
    match reg.product:
        case _:
            pass
    ok = spec.product_id == 3 and x == "values" and isinstance(x, int) and args.height

def _product(args):
    return args.histogram
"""
    found = list(branches(source, "streams/clients/commands/seller.py"))
    kinds = [line.split(": ")[1] for line in found]
    assert kinds == [
        "compares a product",
        "compares with a product's name",
        "looks up by product",
        "looks up by product",
        "tests for a product class",
        "tests for a product class",
        "reads the product field 'tree_height'",
        "reads the product field 'histogram'",
        "reads the product field 'tree_height'",
        "matches a product",
    ], found
    assert list(branches("def _product(args):\n    return args.histogram\n", "x.py"))


def test_no_product_branch_outside_the_products() -> None:
    found = [
        branch
        for path in sorted((ROOT / "streams").rglob("*.py"))
        if not str(path.relative_to(ROOT)).startswith(HOMES)
        for branch in branches(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert not found, "\n".join(found)


def test_every_product_has_its_wire_section() -> None:
    assert set(PRODUCTS) == set(SECTIONS) == set(get_args(WireProduct))
    for name, cls in PRODUCTS.items():
        assert cls.fields is SECTIONS[name], name

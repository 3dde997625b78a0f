"""Hypothesis fuzzing of every topic's payloads (through MarketCore) and of CLI inputs.

Whatever arrives, the core must answer without raising: a rejection with a documented,
machine-readable reason and the original payload, or a valid outcome — and a rejected event must
not change the market's state. The streaming layer counts every outcome in a metric
(``tests/streams/end_to_end/test_service.py`` checks ``emarket_rejections_total`` on a live worker).
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from market.privacy_units import spend_of
from streams.clients import cli
from streams.core import MarketCore, Stores
from streams.core.codecs import encode_purchase
from streams.core.rejections import best_effort_ids
from streams.wire.events import INBOX_EVENT, MAX_DIMENSION, Rejection
from streams.wire.topics import Topics

from ..helpers import TEST_KEYS, open_accounts, party, purchase, registration, value

T = Topics("f")
REASONS = {
    "invalid_event",
    "invalid_value",
    "wrong_dimension",
    "unknown_stream",
    "stream_exists",
    "invalid_schedule",
    "invalid_level",
    "level_above_cap",
    "level_not_for_sale",
    "no_higher_step",
    "price_too_high",
    "currency_mismatch",
    "idempotency_key_reused",
    "conflicting_value",
    "unknown_topic",
    "encryption_required",
    "value_too_old",
    "value_from_the_future",
    "request_too_old",
    "request_from_the_future",
    "bad_signature",
    "unknown_account",
    "not_your_stream",
    "too_large",
    "stream_too_large",
    "account_exists",
    "stale_key_version",
    "too_many_accounts",
    "accuracy_not_for_sale",
    "privacy_window_full",
    "privacy_window_closed",
    "stream_full",
    "wrong_partition",
    "already_held",
    "too_many_streams",
    "values_not_sealed",
    "bad_seal",
}
TOPICS = [T.accounts, T.registrations, T.values, T.purchases]
M = {"market": "f"}


def fresh_core() -> MarketCore:
    core = MarketCore(Stores(), TEST_KEYS, T, clock=lambda: 1)
    open_accounts(core, "seller1", "alice", "bob", "nobody")
    core.handle(T.registrations, registration("s", dimension=3, cap=4.0, **M))
    for i in range(3):
        core.handle(T.values, value("s", f"v{i}", [1.0, 2.0, float(i)], **M))
    core.handle(T.purchases, purchase("s", "alice", "p0", target_level=1.0, **M))
    core.handle(T.values, value("s", "v3", [1.0, 2.0, 3.0], **M))  # p0's outcome sent
    return core


def snapshot(core: MarketCore) -> tuple[Any, ...]:
    st = core.stores
    return (
        {k: v.model_dump_json() for k, v in st.streams.items()},
        {k: sorted(getattr(v, "steps", {})) or v for k, v in st.releases.items()},
        {k: encode_purchase(v) for k, v in st.purchases.items()},
    )


def _partition(topic: str, payload: bytes) -> int:
    """Where a client would have written ``payload``: the partition of its id (else 0), so
    the fuzzing reaches the rules behind the placement check."""
    ids = best_effort_ids(payload)
    key = ids.get("account_id") if topic == T.accounts else ids.get("stream_id")
    return T.partition_of(key) if key else 0


def check(core: MarketCore, topic: str, payload: bytes) -> None:
    before = snapshot(core)
    out = core.handle(topic, payload, partition=_partition(topic, payload), offset=1)
    if out.status == "rejected":
        assert out.reason in REASONS, out.reason
        rej = Rejection.model_validate_json(out.outputs[0].value)
        raw = (
            rej.payload.encode()
            if rej.payload_encoding == "utf-8"
            else base64.b64decode(rej.payload)
        )
        assert rej.message and rej.payload_bytes == len(payload)
        assert raw == payload[: len(raw)] if rej.payload_truncated else raw == payload
        if out.kind != "purchase":  # rejected purchases are stored, so a resend gets the same
            assert snapshot(core) == before
    for o in out.outputs:  # whatever was emitted is a valid event of its topic
        if o.topic.startswith("f.inbox."):
            INBOX_EVENT.validate_json(o.value)
    for s in core.stores.streams.values():
        assert s.spent_nano <= spend_of(s.registration.cap)


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda kids: (
        st.lists(kids, max_size=5) | st.dictionaries(st.text(max_size=10), kids, max_size=5)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(topic=st.sampled_from(TOPICS), data=st.binary(max_size=300))
@pytest.mark.slow
def test_arbitrary_bytes(topic: str, data: bytes) -> None:
    check(fresh_core(), topic, data)


@settings(max_examples=300, deadline=None)
@given(topic=st.sampled_from(TOPICS), doc=JSONISH)
@pytest.mark.slow
def test_arbitrary_json(topic: str, doc: Any) -> None:
    check(fresh_core(), topic, json.dumps(doc, allow_nan=True).encode())


BAD_NUMBERS = st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -1.0, 1e308, -1e-300, 5.0, 1e6])


def _mutations() -> st.SearchStrategy[tuple[str, bytes]]:
    def mutate(base: dict[str, Any], field: str, new: Any, drop: bool) -> bytes:
        doc = dict(base)
        if drop:
            doc.pop(field, None)
        else:
            doc[field] = new
        return json.dumps(doc, allow_nan=True).encode()

    reg = json.loads(registration("s2", **M))
    val = json.loads(value("s", "vx", [1.0, 2.0, 3.0], **M))
    pur = json.loads(purchase("s", "bob", "px", **M))
    return st.one_of(
        st.builds(
            lambda f, n, d: (T.registrations, mutate(reg, f, n, d)),
            st.sampled_from(sorted(reg)),
            JSONISH | BAD_NUMBERS,
            st.booleans(),
        ),
        st.builds(
            lambda f, n, d: (T.values, mutate(val, f, n, d)),
            st.sampled_from(sorted(val)),
            JSONISH | BAD_NUMBERS,
            st.booleans(),
        ),
        st.builds(
            lambda f, n, d: (T.purchases, mutate(pur, f, n, d)),
            st.sampled_from(sorted(pur)),
            JSONISH | BAD_NUMBERS,
            st.booleans(),
        ),
        st.builds(lambda n: (T.purchases, mutate(pur, "target_level", n, False)), BAD_NUMBERS),
        st.builds(
            lambda vs: (T.values, mutate(val, "items", [{**val["items"][0], "values": vs}], False)),
            st.lists(BAD_NUMBERS | st.floats(), min_size=0, max_size=6),
        ),
    )


@settings(max_examples=500, deadline=None)
@given(case=_mutations())
@pytest.mark.slow
def test_mutated_valid_events(case: tuple[str, bytes]) -> None:
    check(fresh_core(), *case)


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (value("s", "huge", [1.0] * (MAX_DIMENSION + 1), **M), "invalid_event"),
        (value("s", "long", [1.0] * 4, **M), "wrong_dimension"),
        (purchase("s", "alice", "down", target_level=0.5, **M), "already_held"),  # a step down
        (purchase("s", "nobody", "p", target_level=4.5, **M), "level_above_cap"),
        (purchase("zz", "alice", "p", **M), "unknown_stream"),
        (purchase("s", "alice", "p9", signer="bob", **M), "bad_signature"),  # bob as alice
        (value("s", "v9", [1.0, 2.0, 3.0], signer="bob", **M), "bad_signature"),
    ],
)
def test_named_bad_inputs(payload: bytes, reason: str | None) -> None:
    core = fresh_core()
    topic = T.values if json.loads(payload)["type"] == "values" else T.purchases
    out = core.handle(topic, payload)
    assert out.reason == reason
    if reason is None:
        assert out.status == "fulfilled" and out.price_minor == 0 and out.new_noise == 0


# --------------------------------------------------------------------------------- CLI
def run_cli(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = cli.main(argv)
        except SystemExit as exc:  # argparse: usage errors exit 2
            code = int(exc.code or 0)
    return code, err.getvalue()


ARG = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
NUMBERISH = st.one_of(ARG, st.floats().map(repr), st.integers().map(str))


@pytest.fixture(scope="module")
def key_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("keys") / "party.key"
    party("fuzzer").save(path)
    return str(path)


@settings(max_examples=150, deadline=None)
@given(stream=ARG, steps=NUMBERISH, cap=NUMBERISH, dim=NUMBERISH, mech=ARG, price=NUMBERISH)
def test_cli_register_inputs(
    key_file: str, stream: str, steps: str, cap: str, dim: str, mech: str, price: str
) -> None:
    code, err = run_cli(
        [
            "--broker",
            "kafka://127.0.0.1:1",
            "register",
            "--key-file",
            key_file,
            "--stream",
            stream,
            "--steps",
            steps,
            "--cap",
            cap,
            "--dimension",
            dim,
            "--mechanism",
            mech,
            "--price-per-level",
            price,
            "--timeout",
            "1",
        ]
    )
    assert code in (2, 3, 4), (code, err)  # usage / invalid / unreachable broker, never a crash
    assert err.strip() and "Traceback" not in err


@settings(max_examples=150, deadline=None)
@given(lines=st.lists(st.one_of(JSONISH.map(json.dumps), ARG), min_size=1, max_size=4))
def test_cli_publish_file_inputs(
    key_file: str, lines: list[str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = tmp_path_factory.mktemp("pub") / "values.jsonl"
    path.write_text("\n".join(lines) + "\n")
    code, err = run_cli(
        [
            "--broker",
            "kafka://127.0.0.1:1",
            "publish",
            "--key-file",
            key_file,
            "--stream",
            "s",
            "--file",
            str(path),
            "--timeout",
            "1",
        ]
    )
    assert code in (0, 2, 3, 4), (code, err)
    if code == 2:
        assert err.startswith(("error: line ", "error: ")) and "Traceback" not in err


@settings(max_examples=150, deadline=None)
@given(target=NUMBERISH, price=NUMBERISH, currency=ARG)
def test_cli_buy_inputs(key_file: str, target: str, price: str, currency: str) -> None:
    code, err = run_cli(
        [
            "--broker",
            "kafka://127.0.0.1:1",
            "buy",
            "--key-file",
            key_file,
            "--stream",
            "s",
            "--target",
            target,
            "--max-price",
            price,
            "--currency",
            currency,
            "--timeout",
            "1",
        ]
    )
    assert code in (1, 2, 3, 4), (code, err)
    assert "Traceback" not in err


def test_market_vectors_stay_finite_under_fuzzed_levels() -> None:
    core = fresh_core()
    for lv in (1e-300, 1e-12, 3.999999999, 4.0):
        core.handle(T.purchases, purchase("s", "carol", f"c{lv}", target_level=lv))
    for state in core.stores.releases.values():
        for vec in state.steps.values():  # type: ignore[union-attr]
            assert np.isfinite(vec).all()

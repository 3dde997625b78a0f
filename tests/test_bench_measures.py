"""The benchmarks' arithmetic: CPU per event gross and net of idle, runs added up, bytes per
topic kind, and the machine line every timing table carries (no timing is asserted)."""

from __future__ import annotations

import os

import pytest

from bench.machine import Machine, Usage, cpu_seconds
from bench.produced import Produced
from bench.service import BROKER, WORKER, Cost, topic_kind


def _cost(events: int, load_s: float, worker: float, idle_s: float, idle_worker: float) -> Cost:
    return Cost(
        events,
        Usage(load_s, {WORKER: worker, BROKER: 0.0}),
        Usage(idle_s, {WORKER: idle_worker, BROKER: 0.5}),
    )


def test_net_cpu_subtracts_the_idle_rate_over_the_run_and_never_goes_negative() -> None:
    cost = _cost(1000, load_s=2.0, worker=1.0, idle_s=4.0, idle_worker=0.4)  # idle: 0.1 core
    assert cost.us(WORKER) == pytest.approx(1000.0)  # 1 s over 1,000 events
    assert cost.us(WORKER, net=True) == pytest.approx(800.0)  # less 0.1 core × 2 s
    # the broker idled at 0.125 core but used nothing in the run: net is 0, not negative
    assert cost.us(BROKER, net=True) == 0.0


def test_two_runs_add_up_to_their_events_and_seconds() -> None:
    both = _cost(1000, 2.0, 1.0, 3.0, 0.3) + _cost(3000, 4.0, 2.0, 3.0, 0.3)
    assert both.events == 4000
    assert both.load.wall_s == pytest.approx(6.0) and both.idle.wall_s == pytest.approx(6.0)
    assert both.us(WORKER) == pytest.approx(750.0)  # 3 s over 4,000 events


def test_bytes_are_summed_per_topic_kind_per_event() -> None:
    made = Produced(
        10,
        {
            "m.inbox.alice": (5, 1000),
            "m.inbox.bob": (5, 3000),
            "app-streams-changelog": (7, 700),
            "m.purchases": (10, 3620),
        },
    )
    per = made.per_event(topic_kind)
    assert per["inbox.<account>"] == (pytest.approx(1.0), pytest.approx(400.0))
    assert per["changelog: streams"] == (pytest.approx(0.7), pytest.approx(70.0))
    assert per["purchases"] == (pytest.approx(1.0), pytest.approx(362.0))
    assert made.bytes_per_event == pytest.approx(832.0)
    assert made.records_per_event == pytest.approx(2.7)
    assert topic_kind("bench-src-abc123") == "source" and topic_kind("bench-dst-x") == "sink"


def test_the_machine_line_names_the_cpu_its_simd_and_the_load() -> None:
    line = Machine.now().line()
    assert line.startswith("machine: ") and " cores, SIMD " in line and "numpy " in line
    assert "load average (1 / 5 / 15 min) " in line and " at start, " in line
    assert cpu_seconds(os.getpid()) >= 0.0


def test_the_crypto_floor_is_every_signature_verification_and_envelope_the_core_makes() -> None:
    """What each path's floor counts is what the core does, call for call (counted on the
    core's own libsodium and envelope calls): a floor that left one out would flatter the
    core's ratio, one that counted more would excuse it."""
    from bench import core

    counted = core.counted_calls()
    paths = [
        core.prepare_purchases(2),
        core.prepare_values(core.VALUES_PER_CORE_BATCH),
        core.prepare_values(core.VALUES_PER_CORE_BATCH, 16),
    ]
    for path in paths:
        assert counted[path.name] == pytest.approx(core.floor_calls(path)), path.name
    # 32 purchases of one seller in one batch: the receipt, the answer, and one notice for all
    assert counted[core.PURCHASE] == pytest.approx({"seal": 1, "sign": 2 + 1 / 32, "verify": 1})
    assert counted[core.VALUE16]["verify"] == pytest.approx(1 / 16)


def test_a_path_is_set_against_the_floors_of_its_own_run() -> None:
    """Worker CPU outside the core per record the worker produced (the input records are the
    load generator's) and events per core-second, from the rows of one run."""
    from bench.core import Measure
    from bench.service import PURCHASE, TRANSPORT, Row, Run, floors

    transport = Row(TRANSPORT, 0.0, 0.0, 0.0, _cost(1000, 1.0, 0.02, 1.0, 0.0))  # 20 µs
    made = Produced(
        100, {"m.purchases": (100, 36_000), "m.inbox.b": (200, 1), "x-changelog": (300, 1)}
    )
    purchase = Row(PURCHASE, 0.0, 0.0, 0.0, _cost(100, 1.0, 0.1, 1.0, 0.0), made)  # 1,000 µs
    run = Run([transport, purchase], [], {PURCHASE: Measure(PURCHASE, 600.0, 150.0, 30.0)})
    got = floors(run, PURCHASE)
    assert got.records == pytest.approx(5.0)  # 2 inbox + 3 changelog records per purchase
    assert got.outside_us == pytest.approx((1000.0 - 600.0) / 5.0)
    assert got.per_core_second == pytest.approx(1000.0)
    assert got.transport_us == pytest.approx(20.0) and got.crypto_us == pytest.approx(150.0)

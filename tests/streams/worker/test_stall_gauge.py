"""``emarket_stalled`` follows the same rule as ``/health`` (no broker needed)."""

from __future__ import annotations

import time

from streams.core import Stores
from streams.wire.topics import Topics
from streams.worker.metrics import build_metrics
from streams.worker.web import VectorBytes, refresh_gauges


class _Consumer:
    """What refresh_gauges reads off a consumer: 5 messages waiting on the values topic."""

    def __init__(self, topics: Topics) -> None:
        from aiokafka import TopicPartition

        self.tp = TopicPartition(topics.values, 0)
        self._committed_offset = {self.tp: 10}

    def assignment(self) -> set[object]:
        return {self.tp}

    def highwater(self, tp: object) -> int:
        return 15


def test_stalled_only_while_input_waits_on_a_reachable_broker() -> None:
    topics, m = Topics("s"), build_metrics()
    long_ago = time.time() - 100
    gauge = lambda: m.registry.get_sample_value("emarket_stalled")  # noqa: E731
    m.set_broker_up(True)
    refresh_gauges(m, Stores(), _Consumer(topics), topics, 30.0, started=long_ago)
    assert gauge() == 1  # input waits, no batch for 100 s
    m.batch_done(time.time())
    refresh_gauges(m, Stores(), _Consumer(topics), topics, 30.0, started=long_ago)
    assert gauge() == 0  # a batch just completed
    m.batch_done(long_ago)
    m.set_broker_up(False)
    refresh_gauges(m, Stores(), _Consumer(topics), topics, 30.0, started=long_ago)
    assert gauge() == 0  # broker down: /health says "degraded", its own alert pages
    m.set_broker_up(True)
    refresh_gauges(m, Stores(), None, topics, 30.0, started=long_ago)
    assert gauge() == 0  # nothing waiting: idle is not stalled


def test_vector_bytes_walks_the_state_a_slice_at_a_time() -> None:
    """The gauge of vector bytes reads at most ``per_refresh`` entries per refresh (a whole
    walk paused the event loop on every refresh), and shows the sum of its last full pass."""
    from market import ChainState
    from tests.streams.helpers import market_core, registration, value

    core = market_core("seller1")
    t = core.ctx.topics
    core.handle(t.registrations, registration("s", dimension=8, retain_last=50))
    for i in range(20):
        core.handle(t.values, value("s", f"v{i}", [1.0] * 8))

    def exact() -> int:
        return sum(v.nbytes for v in counting.values() if isinstance(v, ChainState))

    looked: list[str] = []

    class Counting(dict):  # type: ignore[type-arg]
        def get(self, key: object, default: object = None) -> object:
            looked.append(str(key))
            return super().get(key, default)

    counting = Counting(core.stores.releases)
    scan = VectorBytes(per_refresh=7)
    totals = [scan.step(counting) for _ in range(3)]
    assert totals[:2] == [None, None] and totals[2] == exact() > 0  # 20 entries: 3 slices
    assert len(looked) == 20 and max(len(looked[i : i + 7]) for i in range(0, 20, 7)) == 7
    before = exact()
    counting["s/new"] = counting.pop("s/v0")  # a change during a pass: the next pass sees it
    del counting["s/v1"]
    assert [scan.step(counting) for _ in range(2)] == [before, before]  # pass still running
    assert scan.step(counting) == exact() < before
    m = build_metrics()
    refresh_gauges(m, core.stores, None, t, 30.0, started=time.time())  # no scanner: one pass
    assert m.registry.get_sample_value("emarket_state_vector_bytes") == before  # the store's

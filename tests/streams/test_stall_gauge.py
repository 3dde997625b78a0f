"""``emarket_stalled`` follows the same rule as ``/health`` (no broker needed)."""

from __future__ import annotations

import time

from streams.core import Stores
from streams.wire.topics import Topics
from streams.worker.metrics import build_metrics
from streams.worker.web import refresh_gauges


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

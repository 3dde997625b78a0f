"""Reaching a Kafka-protocol broker: the embedded Tansu (:mod:`.embedded`), topic administration
(:mod:`.admin`) and SASL credentials (:mod:`.auth`)."""

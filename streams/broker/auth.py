"""Credentials for reaching a Kafka broker (SASL), shared by workers and clients."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["env_auth", "kafka_auth"]


def kafka_auth(
    user: str | None,
    password: str | None,
    mechanism: str = "SCRAM-SHA-512",
    security: str = "SASL_PLAINTEXT",
) -> dict[str, Any]:
    """aiokafka keyword arguments for SASL (PLAIN or SCRAM), or {} without a user."""
    if not user:
        return {}
    if not password:
        raise ValueError("a Kafka user needs a password (EMARKET_KAFKA_PASSWORD)")
    return {
        "security_protocol": security,
        "sasl_mechanism": mechanism,
        "sasl_plain_username": user,
        "sasl_plain_password": password,
    }


def env_auth() -> dict[str, Any]:
    """aiokafka SASL arguments from ``EMARKET_KAFKA_*`` (empty without a user)."""
    return kafka_auth(
        os.environ.get("EMARKET_KAFKA_USER"),
        os.environ.get("EMARKET_KAFKA_PASSWORD"),
        os.environ.get("EMARKET_KAFKA_MECHANISM", "SCRAM-SHA-512"),
        os.environ.get("EMARKET_KAFKA_SECURITY", "SASL_PLAINTEXT"),
    )

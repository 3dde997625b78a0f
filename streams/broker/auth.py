"""Credentials for reaching a Kafka broker (SASL, optionally over TLS), shared by workers and
clients.

``SASL_PLAINTEXT`` suits a private network (the compose file's internal listener); across the
internet use ``SASL_SSL`` (``EMARKET_KAFKA_SECURITY=SASL_SSL``), with ``EMARKET_KAFKA_CA`` naming
the CA file when the broker's certificate is not signed by a public authority.
"""

from __future__ import annotations

import os
import ssl
from typing import Any

__all__ = ["MECHANISMS", "env_auth", "kafka_auth"]

#: SASL mechanisms a user and password can authenticate with
MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")


def kafka_auth(
    user: str | None,
    password: str | None,
    mechanism: str = "SCRAM-SHA-512",
    security: str = "SASL_PLAINTEXT",
    cafile: str | None = None,
) -> dict[str, Any]:
    """aiokafka keyword arguments for SASL (PLAIN or SCRAM), or {} without a user.

    With ``security="SASL_SSL"`` the connection is TLS, verified against the system's
    authorities or ``cafile``.
    """
    if not user:
        if security == "SASL_SSL":
            raise ValueError(
                "EMARKET_KAFKA_SECURITY=SASL_SSL needs EMARKET_KAFKA_USER and _PASSWORD"
            )
        return {}
    if mechanism not in MECHANISMS:
        raise ValueError(
            f"EMARKET_KAFKA_MECHANISM must be one of {', '.join(MECHANISMS)}, not {mechanism!r}"
        )
    if not password:
        raise ValueError("a Kafka user needs a password (EMARKET_KAFKA_PASSWORD)")
    if security not in ("SASL_PLAINTEXT", "SASL_SSL"):
        raise ValueError(
            f"EMARKET_KAFKA_SECURITY must be SASL_PLAINTEXT or SASL_SSL, not {security!r}"
        )
    out: dict[str, Any] = {
        "security_protocol": security,
        "sasl_mechanism": mechanism,
        "sasl_plain_username": user,
        "sasl_plain_password": password,
    }
    if security == "SASL_SSL":
        try:
            out["ssl_context"] = ssl.create_default_context(cafile=cafile)
        except (OSError, ssl.SSLError) as exc:
            why = getattr(exc, "strerror", None) or exc
            raise ValueError(f"EMARKET_KAFKA_CA {cafile}: not a readable CA file ({why})") from None
    return out


def env_auth() -> dict[str, Any]:
    """aiokafka SASL arguments from ``EMARKET_KAFKA_*`` (empty without a user)."""
    return kafka_auth(
        os.environ.get("EMARKET_KAFKA_USER"),
        os.environ.get("EMARKET_KAFKA_PASSWORD"),
        os.environ.get("EMARKET_KAFKA_MECHANISM", "SCRAM-SHA-512"),
        os.environ.get("EMARKET_KAFKA_SECURITY", "SASL_PLAINTEXT"),
        os.environ.get("EMARKET_KAFKA_CA") or None,
    )

"""Signing a webhook as the Standard Webhooks spec says (https://www.standardwebhooks.com).

Three headers: ``webhook-id`` (the message's id, the same on every retry, so a receiver
de-duplicates by it), ``webhook-timestamp`` (unix seconds of this try) and
``webhook-signature``: ``v1,`` + base64 of HMAC-SHA256 over ``{id}.{timestamp}.{body}``
with the secret's bytes (the secret is written ``whsec_<base64>``). Any Standard Webhooks
library verifies it (the tests use the ``standardwebhooks`` package).
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac

SECRET_PREFIX = "whsec_"


def secret_bytes(secret: str) -> bytes:
    """The key a ``whsec_<base64>`` secret stands for (ValueError for anything else)."""
    if not secret.startswith(SECRET_PREFIX):
        raise ValueError("a webhook secret is written whsec_<base64>")
    try:
        key = base64.b64decode(secret[len(SECRET_PREFIX):], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("a webhook secret is written whsec_<base64>: the part after whsec_ is not base64") from None
    if len(key) < 16:
        raise ValueError("a webhook secret needs at least 16 bytes of key")
    return key


def signature(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    signed = f"{message_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_bytes(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def headers(secret: str, message_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    return {"webhook-id": message_id, "webhook-timestamp": str(timestamp),
            "webhook-signature": signature(secret, message_id, timestamp, body),
            "content-type": "application/json"}

"""Per-worker bearer credentials: ``<worker_id>.<secret>``; only SHA-256(secret) is stored.

The secret is 256 random bits, so a plain SHA-256 is enough at rest (no
password stretching needed), and comparison is constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from arbiter.protocol.vocabulary import WORKER_ID


def new_secret() -> str:
    return secrets.token_urlsafe(32)


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def format_credential(worker_id: str, secret: str) -> str:
    return f"{worker_id}.{secret}"


def parse_credential(credential: str) -> tuple[str, str] | None:
    worker_id, dot, secret = credential.strip().partition(".")
    if not dot or not secret or not WORKER_ID.match(worker_id):
        return None
    return worker_id, secret


def digest_matches(digest: str, stored_sha256: str) -> bool:
    """Constant-time comparison of hash_secret(secret) with the stored hash."""
    return hmac.compare_digest(digest, stored_sha256)

"""Database login roles of the cutover: legacy workers' accounts and the arbiter's own.

Each call converges one role and says what it did (``created``, ``updated``,
``unchanged``, ``dropped``, ``absent``), so Ansible reports a change only when
there was one. Passwords never travel: the SCRAM-SHA-256 verifier is computed
here and compared with (or stored as) ``pg_authid.rolpassword``, the way
``psql``'s ``\\password`` does it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

import psycopg
from psycopg import sql

from arbiter.store.sqlfiles import Statements

OPS = Statements("operator.sql")
SCRAM_ITERATIONS = 4096


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _scram_keys(password: str, salt: bytes, iterations: int) -> tuple[bytes, bytes]:
    salted = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()
    return hashlib.sha256(client_key).digest(), server_key


def scram_verifier(password: str, salt: bytes | None = None, iterations: int = SCRAM_ITERATIONS) -> str:
    salt = salt if salt is not None else os.urandom(16)
    stored_key, server_key = _scram_keys(password, salt, iterations)
    return f"SCRAM-SHA-256${iterations}:{_b64(salt)}${_b64(stored_key)}:{_b64(server_key)}"


def verifier_matches(stored: str | None, password: str) -> bool:
    """True when ``stored`` (pg_authid.rolpassword) is a SCRAM verifier of ``password``."""
    if not stored or not stored.startswith("SCRAM-SHA-256$"):
        return False
    try:
        head, keys = stored[len("SCRAM-SHA-256$"):].split("$")
        iterations, salt = head.split(":")
        stored_key, server_key = keys.split(":")
        expected = _scram_keys(password, base64.b64decode(salt), int(iterations))
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(expected[0], base64.b64decode(stored_key)) and \
        hmac.compare_digest(expected[1], base64.b64decode(server_key))


def _compose(statement: str, **parts) -> sql.Composed:
    return sql.SQL(statement).format(**parts)


def ensure_login_role(conn: psycopg.Connection, role: str, password: str, member_of: str | None = None) -> str:
    if not password:
        raise ValueError(f"an empty password for role {role!r}")
    row = conn.execute(OPS.find_role, {"role": role}).fetchone()
    outcome = "unchanged"
    with conn.transaction():
        if row is None:
            conn.execute(_compose(OPS.create_login_role, role=sql.Identifier(role),
                                  verifier=sql.Literal(scram_verifier(password))))
            outcome = "created"
        elif not row[1] or not verifier_matches(row[0], password):
            conn.execute(_compose(OPS.set_role_password, role=sql.Identifier(role),
                                  verifier=sql.Literal(scram_verifier(password))))
            outcome = "updated"
        if member_of and not conn.execute(OPS.role_is_member, {"role": role, "group": member_of}).fetchone()[0]:
            conn.execute(_compose(OPS.grant_membership, role=sql.Identifier(role), group=sql.Identifier(member_of)))
            outcome = "updated" if outcome == "unchanged" else outcome
    return outcome


def grant_arbiter_privileges(conn: psycopg.Connection, role: str) -> str:
    """The arbiter reads and writes every table of the schema (never DELETE: history is append-only)."""
    if not conn.execute(OPS.tables_missing_arbiter_privileges, {"role": role}).fetchall():
        return "unchanged"
    conn.execute(_compose(OPS.grant_arbiter_privileges, role=sql.Identifier(role)))
    return "updated"


def drop_login_role(conn: psycopg.Connection, role: str) -> str:
    """Drop the role and cut its open sessions, so a dropped account can neither log in nor go on."""
    if conn.execute(OPS.find_role, {"role": role}).fetchone() is None:
        return "absent"
    with conn.transaction():
        conn.execute(_compose(OPS.drop_role, role=sql.Identifier(role)))
    conn.execute(OPS.terminate_role_sessions, {"role": role})
    return "dropped"

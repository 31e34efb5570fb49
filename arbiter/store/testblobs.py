"""Test data in the database, content-addressed: stored by judgectl, served by the arbiter.

A file is stored once, by its SHA-256, in chunks of ``CHUNK_BYTES`` (``test_blobs``,
``test_blob_chunks``); a data set is the listing of its files under its digest
(``test_data_files``; the digest is arbiter/protocol/testdata.py's). Memory stays bounded on both sides: the
upload reads and writes one chunk at a time, the server sends one chunk at a time.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import psycopg

from arbiter.store.sqlfiles import Statements

Q = Statements("queries.sql")
OPS = Statements("operator.sql")
CHUNK_BYTES = 1 << 20


def store_data_set(conn: psycopg.Connection, root: Path, digest: str, entries) -> int:
    """Store every file of a data set not stored yet, then its listing. Returns the bytes stored.
    Each file is one transaction: a crash leaves whole files or nothing."""
    stored = 0
    for entry in entries:
        with conn.transaction():
            if conn.execute(OPS.add_blob, {"sha256": entry.sha256, "size": entry.size}).fetchone() is not None:
                h = hashlib.sha256()
                with open(root / entry.path, "rb") as f:
                    for seq, chunk in enumerate(iter(lambda: f.read(CHUNK_BYTES), b"")):
                        h.update(chunk)
                        conn.execute(OPS.add_blob_chunk, {"sha256": entry.sha256, "seq": seq, "data": chunk})
                if h.hexdigest() != entry.sha256:  # changed while we read it: store nothing of it
                    raise ValueError(f"{entry.path} changed while it was stored; run the command again")
                stored += entry.size
    with conn.transaction():
        for entry in entries:
            conn.execute(OPS.add_data_file, {"digest": digest, "path": entry.path, "size": entry.size,
                                            "sha256": entry.sha256})
    return stored


def data_set(conn: psycopg.Connection, digest: str) -> list[dict]:
    return [{"path": p, "size": s, "sha256": h} for p, s, h in conn.execute(Q.data_set_files, {"digest": digest})]


def blob_size(conn: psycopg.Connection, sha256: str) -> int | None:
    row = conn.execute(Q.blob_size, {"sha256": sha256}).fetchone()
    return None if row is None else row[0]


def blob_chunk(conn: psycopg.Connection, sha256: str, seq: int) -> bytes:
    row = conn.execute(Q.blob_chunk, {"sha256": sha256, "seq": seq}).fetchone()
    if row is None:
        raise LookupError(f"chunk {seq} of {sha256} is missing")
    return bytes(row[0])

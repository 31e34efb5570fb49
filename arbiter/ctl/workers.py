"""judgectl: Arbiter workers and their credentials: worker add/ensure/rotate/revoke."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import psycopg
from psycopg.rows import dict_row

from arbiter.ctl.common import OPS, CtlError, InputError, read_secret_arg
from arbiter.protocol.vocabulary import LANGUAGES

# The worker's own parser: what judgectl stores is exactly what a worker accepts.
from arbiter.store import credentials, leases, status

# How long a replaced worker credential stays valid: time to roll the new one out to the worker.
DEFAULT_OVERLAP_SECS = 3600.0

def _languages(arg: str) -> list[str]:
    languages = sorted(set(arg.split(",")))
    unknown = set(languages) - set(LANGUAGES)
    if unknown:
        raise InputError(f"unknown language(s): {', '.join(sorted(unknown))}")
    return languages

def _write_credential(worker_id: str, secret: str, path: str | None) -> None:
    """The credential goes to a 0600 file, or to stdout when no file is named: never into an argument."""
    credential = credentials.format_credential(worker_id, secret)
    if path:
        fd = os.open(Path(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(credential + "\n")
        print(f"credential for {worker_id} written to {path} (mode 0600)")
    else:
        print(credential)

def _overlap_secs(value: float) -> float:
    if not 0 <= value <= 30 * 86400:
        raise InputError("--overlap must be between 0 and 2592000 seconds (30 days)")
    return value

MAX_SLOTS = 256

def _slots(value: int) -> int:
    if not 1 <= value <= MAX_SLOTS:
        raise InputError(f"--slots must be between 1 and {MAX_SLOTS}")
    return value

def cmd_worker_add(args, conn) -> int:
    if not credentials.WORKER_ID.match(args.worker_id):
        raise InputError("worker id must be 1-63 chars of a-z, 0-9, '_' or '-', starting with a letter or digit")
    languages = _languages(args.languages)
    secret = credentials.new_secret()
    try:
        conn.execute(OPS.add_worker, {"worker_id": args.worker_id, "kind": args.kind, "languages": languages,
                                      "secret_sha256": credentials.hash_secret(secret), "slots": _slots(args.slots)})
    except psycopg.errors.UniqueViolation:
        raise CtlError(f"worker {args.worker_id!r} already exists (use 'worker rotate' to issue a new credential)") from None
    _write_credential(args.worker_id, secret, args.credential_file)
    return 0

def cmd_worker_ensure(args, conn) -> int:
    """Register a worker with a credential the operator holds (ansible-vault): idempotent.

    A changed credential is a rotation: the one it replaces stays valid for ``--overlap`` seconds, so the
    worker can be handed the new one afterwards with no refused request."""
    overlap = _overlap_secs(args.overlap)
    parsed = credentials.parse_credential(read_secret_arg(args.credential_file, "credential"))
    if parsed is None or parsed[0] != args.worker_id:
        raise CtlError(f"the credential is not of the form '{args.worker_id}.<secret>'")
    digest = credentials.hash_secret(parsed[1])
    values = {"worker_id": args.worker_id, "kind": args.kind, "secret_sha256": digest,
              "languages": _languages(args.languages), "overlap_secs": overlap, "slots": _slots(args.slots)}
    with conn.transaction():
        row = conn.execute(OPS.find_worker_secret, {"worker_id": args.worker_id}).fetchone()
        if row is None:
            conn.execute(OPS.add_worker, values)
            print(f"created worker {args.worker_id}")
            return 0
        changes = []
        if not credentials.digest_matches(digest, row[0]) or row[1]:
            conn.execute(OPS.rotate_worker_secret, values)
            changes.append("credential rotated" + ("" if row[1] else f" (the previous one valid {overlap:g}s more)"))
        if row[2] != args.kind or sorted(row[3]) != values["languages"] or row[4] != values["slots"]:
            conn.execute(OPS.set_worker_profile, values)
            changes.append("kind/languages/slots set")
    print(f"updated worker {args.worker_id}: {', '.join(changes)}" if changes else f"unchanged worker {args.worker_id}")
    return 0

def cmd_worker_rotate(args, conn) -> int:
    """A new random secret; the previous one stays valid for ``--overlap`` seconds (DB time)."""
    overlap = _overlap_secs(args.overlap)
    secret = credentials.new_secret()
    row = conn.execute(OPS.rotate_worker_secret, {"worker_id": args.worker_id, "overlap_secs": overlap,
                                                 "secret_sha256": credentials.hash_secret(secret)}).fetchone()
    if row is None:
        raise CtlError(f"no worker {args.worker_id!r}")
    _write_credential(args.worker_id, secret, args.credential_file)
    until = f"until {row[0]:%Y-%m-%d %H:%M:%S%z}" if row[0] else "no longer (the worker was revoked)"
    print(f"the previous credential of {args.worker_id} stays valid {until}", file=sys.stderr)
    return 0

def cmd_worker_list(args, conn) -> int:
    """Each worker: busy (holds leases), idle (heard from lately), silent, paused or revoked."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = status.workers_of(cur)
    for row in rows:
        state = status.worker_state(row)
        seen = row["last_seen_ago_s"]
        heard = "never" if seen is None else f"{seen:.0f}s ago"
        why = f" ({row['paused_reason']})" if row["paused"] and row["paused_reason"] else ""
        print(f"{row['worker_id']:<16} {row['kind']:<10} {state:<8} leases {row['leases']}/{row['slots']:<3} "
              f"last heard {heard:<10} languages {','.join(row['languages'])}{why}")
    print(f"{len(rows)} worker(s)")
    return 0


MAX_PAUSE_REASON = 200


def _known_worker(conn, worker_id: str) -> None:
    """One line and exit 2 for a bad or unknown worker id; a schema without pauses is the operator's to migrate."""
    if not credentials.WORKER_ID.match(worker_id):
        raise InputError(f"bad worker id {worker_id[:80]!r}: 1-63 chars of a-z, 0-9, '_' or '-', starting with a "
                         "letter or digit")
    if not leases.worker_pauses_present(conn):
        raise CtlError("this database has no worker pauses before the stage-4 schema (judgectl migrate --to stage4)")
    if conn.execute(OPS.find_worker_secret, {"worker_id": worker_id}).fetchone() is None:
        raise InputError(f"no worker {worker_id!r} (judgectl worker list names them)")


def cmd_worker_pause(args, conn) -> int:
    """The arbiter grants the worker no new lease from its next dispatch round on; the leases it holds
    run to their end (its results are taken as ever)."""
    reason = args.reason or ""
    if len(reason) > MAX_PAUSE_REASON or not reason.isprintable():
        raise InputError(f"--reason must be at most {MAX_PAUSE_REASON} printable characters")
    _known_worker(conn, args.worker_id)
    row = conn.execute(OPS.pause_worker, {"worker_id": args.worker_id, "reason": reason}).fetchone()
    leases = conn.execute(OPS.count_worker_leases, {"worker_id": args.worker_id}).fetchone()[0]
    print(f"{'paused' if row else 'already paused'} {args.worker_id}: no new leases; "
          f"{leases} lease(s) it holds run to their end")
    return 0


def cmd_worker_resume(args, conn) -> int:
    _known_worker(conn, args.worker_id)
    row = conn.execute(OPS.resume_worker, {"worker_id": args.worker_id}).fetchone()
    print(f"resumed {args.worker_id}" if row else f"{args.worker_id} was not paused")
    return 0


def cmd_worker_revoke(args, conn) -> int:
    if conn.execute(OPS.revoke_worker, {"worker_id": args.worker_id}).rowcount == 0:
        raise CtlError(f"no active worker {args.worker_id!r}")
    print(f"revoked {args.worker_id}")
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("worker", help="manage arbiter workers and their credentials")
    wsub = p.add_subparsers(dest="worker_command", required=True)
    wa = wsub.add_parser("add", help="register a worker; prints its credential once")
    wa.add_argument("worker_id")
    wa.add_argument("--kind", choices=["home", "production"], required=True)
    wa.add_argument("--languages", default="c,cpp,python3")
    wa.add_argument("--slots", type=int, default=1, help="judge slots the worker runs (its config's slots)")
    wa.add_argument("--credential-file", help="write the credential here (mode 0600) instead of printing it")
    wa.set_defaults(func=cmd_worker_add)
    we = wsub.add_parser("ensure", help="register a worker with a given credential (idempotent)")
    we.add_argument("worker_id")
    we.add_argument("--kind", choices=["home", "production"], required=True)
    we.add_argument("--languages", default="c,cpp,python3")
    we.add_argument("--slots", type=int, default=1, help="judge slots the worker runs (its config's slots)")
    we.add_argument("--credential-file", required=True, help="file holding '<worker_id>.<secret>', or -")
    we.add_argument("--overlap", type=float, default=DEFAULT_OVERLAP_SECS,
                    help="a changed credential: seconds the previous one stays valid (default 3600)")
    we.set_defaults(func=cmd_worker_ensure)
    wo = wsub.add_parser("rotate", help="issue a new credential; the previous one stays valid for --overlap seconds")
    wo.add_argument("worker_id")
    wo.add_argument("--overlap", type=float, default=DEFAULT_OVERLAP_SECS,
                    help="seconds the previous credential stays valid (default 3600)")
    wo.add_argument("--credential-file", help="write the new credential here (mode 0600) instead of printing it")
    wo.set_defaults(func=cmd_worker_rotate)
    wl = wsub.add_parser("list", help="every worker: kind, busy/idle/silent/paused/revoked, leases, last heard")
    wl.set_defaults(func=cmd_worker_list)
    wp = wsub.add_parser("pause", help="the arbiter grants the worker no new lease; what it holds runs to its end")
    wp.add_argument("worker_id")
    wp.add_argument("--reason", help="why, shown by worker list and /status (at most 200 characters)")
    wp.set_defaults(func=cmd_worker_pause)
    wu = wsub.add_parser("resume", help="the worker gets leases again")
    wu.add_argument("worker_id")
    wu.set_defaults(func=cmd_worker_resume)
    wr = wsub.add_parser("revoke", help="revoke a worker's credentials (the current one and any previous one)")
    wr.add_argument("worker_id")
    wr.set_defaults(func=cmd_worker_revoke)

"""judgectl: The queue: submit, rejudge, status, canary run (the cutover gate), leases drain."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from psycopg.rows import dict_row

from arbiter.ctl.common import OPS, POLL_SECS, CtlError, InputError, check_user_name, parse_since
from arbiter.protocol.vocabulary import LANGUAGES

# The worker's own parser: what judgectl stores is exactly what a worker accepts.
from arbiter.store import canary, leases, status


def cmd_submit(args, conn) -> int:
    if args.language not in LANGUAGES:
        raise InputError(f"unknown language {args.language!r} (choose from {', '.join(sorted(LANGUAGES))})")
    check_user_name(args.user)
    try:
        raw = Path(args.source).read_bytes() if args.source != "-" else sys.stdin.buffer.read()
    except OSError as exc:
        raise InputError(f"cannot read source {args.source}: {exc.strerror}") from None
    try:
        source = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"source {args.source} is not UTF-8 text (byte {exc.start}); nothing stored") from None
    try:
        leases.check_source(source)
    except leases.SourceRefused as exc:
        raise InputError(f"source {args.source}: {exc}; nothing stored") from None
    problem = conn.execute(OPS.find_problem, {"slug": args.problem}).fetchone()
    if problem is None:
        raise InputError(f"unknown problem {args.problem!r}")
    with conn.transaction():
        user_id = conn.execute(OPS.ensure_user, {"name": args.user}).fetchone()[0]
    print(leases.submit(conn, user_id, problem[0], args.language, source))
    return 0

def cmd_rejudge(args, conn) -> int:
    if args.status is not None:
        if args.data_changed or args.submission_ids:
            raise InputError("--status goes with --since and --problem, not with submission ids or --data-changed")
        if args.status not in leases.TERMINAL:
            raise InputError(f"--status must be a verdict ({', '.join(sorted(leases.TERMINAL))}), "
                             f"not {args.status!r}")
        params = {"status": args.status, "slug": args.problem,
                  **parse_since(args.since)}
        ids = [r[0] for r in conn.execute(OPS.decided_with_status, params).fetchall()]
        if not ids:
            print(f"nothing to rejudge: no submission ended {args.status}"
                  + (f" since {args.since}" if args.since else "") + (f" on {args.problem}" if args.problem else ""))
            return 0
        args.submission_ids = ids
    elif args.since:
        raise InputError("--since goes with --status")
    elif args.data_changed:
        if not args.problem or args.submission_ids:
            raise InputError("--data-changed goes with --problem SLUG and no submission ids")
        row = conn.execute(OPS.find_problem_digest, {"slug": args.problem}).fetchone()
        if row is None:
            raise InputError(f"no problem {args.problem!r}")
        if row[0] is None:
            raise CtlError(f"problem {args.problem!r} has no test-data digest yet: set it with "
                           "'judgectl problem data' first")
        ids = [r[0] for r in conn.execute(OPS.judged_with_other_data, {"slug": args.problem}).fetchall()]
        if not ids:
            print(f"nothing to rejudge: every decided submission of {args.problem} was judged with {row[0][:12]}")
            return 0
        args.submission_ids = ids
    elif args.problem or not args.submission_ids:
        raise InputError("give submission ids, --status VERDICT [--since AGE] [--problem SLUG], "
                         "or --problem SLUG --data-changed")
    moved = dict(leases.rejudge(conn, args.submission_ids))
    missing = [sid for sid in args.submission_ids if sid not in moved]
    for sid, gen in moved.items():
        print(f"{sid} pending (lease_gen {gen})")
    if missing:
        raise CtlError(f"not rejudged (unknown or not in a terminal state): {', '.join(map(str, missing))}")
    return 0

def cmd_status(args, conn) -> int:
    with conn.cursor(row_factory=dict_row) as cur:
        site = status.snapshot(cur)
    if args.json:
        print(json.dumps(site, default=str, indent=2))
        return 0
    in_flight, workers = site["leases"], site["workers"]
    print("queue:")
    for state, count in site["queue"].items():
        print(f"  {state:<13} {count:>6}")
    print(f"  {'decided':<13} ~{site['decided_estimate']:>5} (estimate)")
    print(f"  {'canaries':<13} {site['canaries_open']:>6} (open; nobody's work)")
    print("leases in flight:")
    if not in_flight:
        print("  (none)")
    for row in in_flight:
        slot = "" if row["slot"] is None else f"/{row['slot']}"
        print(f"  #{row['submission_id']:<6} {(row['worker_id'] or '-') + slot:<14} gen {row['lease_gen']:<3} "
              f"age {row['age_s']:>6.1f}s  expires in {row['expires_in_s'] if row['expires_in_s'] is not None else '-':>6}s "
              f"{'confirmed' if row['confirmed'] else 'unconfirmed'} attempt {row['judge_attempts']}")
    print("workers:")
    if not workers:
        print("  (none)")
    for row in workers:
        seen = f"{row['last_seen_ago_s']:.1f}s ago" if row["last_seen_ago_s"] is not None else "never"
        state = "revoked" if row["revoked"] else "active"
        print(f"  {row['worker_id']:<12} {row['kind']:<10} {state:<8} last heard {seen:<14} "
              f"busy slots {row['leases']}/{row['slots']}  languages {','.join(row['languages'])}")
    print("last canary per worker:")
    if not site["last_canaries"]:
        print("  (none)")
    for row in site["last_canaries"]:
        outcome = "ok" if row["ok"] else f"FAILED (expected {row['expected']})"
        print(f"  {row['worker_id']:<12} #{row['submission_id']:<6} {row['language']:<8} {row['verdict']:<12} "
              f"{outcome}  took {row['duration_s']:.3f}s  decided {row['decided_ago_s']:.1f}s ago")
    return 0

def cmd_leases_drain(args, conn) -> int:
    """The janitor's reclaim, run by hand: for a rollback after the arbiters are gone (or broken).

    Lease expiry is still decided by the database's clock; a worker that reports in time keeps its lease.
    """

    deadline = time.monotonic() + args.wait
    while True:
        for item in leases.reclaim_expired(conn, max_attempts=args.max_attempts):
            print(f"#{item.submission_id} from {item.worker_id or '-'} -> {item.new_status}")
        live = conn.execute(OPS.count_live_arbiter_leases).fetchone()[0]
        if live == 0:
            print("no arbiter leases left")
            return 0
        if time.monotonic() >= deadline:
            raise CtlError(f"{live} arbiter lease(s) still live after {args.wait:.0f}s; run again or wait longer")
        time.sleep(POLL_SECS)

def cmd_canary_run(args, conn) -> int:
    """The cutover gate: a canary pinned to the worker, its verdict checked, one line with the timings.

    Needs no traffic (a quiet site passes in seconds) and proves the whole judging path of that one
    worker through that one transport; a wrong verdict fails in seconds, naming the verdict.
    """

    # An arbiter worker must be registered (and judge the language). A direct (legacy) worker, while
    # the legacy scheme exists (stages 0-3), registers nowhere before it first polls: not checked.
    arbiter_workers, legacy_nodes = conn.execute(OPS.worker_tables).fetchone()
    worker = conn.execute(OPS.find_active_worker, {"worker_id": args.worker_id}).fetchone() if arbiter_workers else None
    if worker is None and (not legacy_nodes or args.transport == "arbiter"):
        raise InputError(f"no active worker {args.worker_id!r} (judgectl worker list)")
    if worker is not None and args.language not in worker[1]:
        raise InputError(f"worker {args.worker_id} does not judge {args.language} (it judges {', '.join(worker[1])})")
    sid = canary.submit(conn, args.language, pinned_worker=args.worker_id)
    deadline = time.monotonic() + args.timeout
    while not (result := canary.outcome(conn, sid)).decided:
        if time.monotonic() >= deadline:
            if canary.withdraw(conn, sid):
                raise CtlError(f"canary #{sid}: worker {args.worker_id} did not take it in {args.timeout:.0f}s "
                               f"(withdrawn)")
            raise CtlError(f"canary #{sid}: worker {args.worker_id} took it but decided nothing in "
                           f"{args.timeout:.0f}s ({result.status})")
        time.sleep(POLL_SECS)
    where = f"canary #{sid} ({args.language}) on {result.worker_id or '-'} through {result.transport or '-'}"
    if not result.as_expected:
        why = ""
        if result.detail:
            why = " (" + json.dumps(result.detail, sort_keys=True, default=str)[:300] + ")"
        raise CtlError(f"{where}: verdict {result.status}, expected {result.expected}{why}; {result.timings()}")
    if result.worker_id != args.worker_id:
        raise CtlError(f"{where}: decided by {result.worker_id}, not by the pinned worker {args.worker_id}")
    if args.transport and result.transport != args.transport:
        raise CtlError(f"{where}: decided through {result.transport}, expected {args.transport}")
    print(f"{where}: {result.status} as expected; {result.timings()}")
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("submit", help="submit a solution (prints the submission id)")
    p.add_argument("--user", required=True)
    p.add_argument("--problem", required=True, help="problem slug")
    p.add_argument("--language", required=True)
    p.add_argument("source", help="source file, or - for standard input")
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("rejudge", help="send terminal submissions back to the queue with a new generation")
    p.add_argument("submission_ids", nargs="*", type=int)
    p.add_argument("--problem", help="with --data-changed: the problem's slug")
    p.add_argument("--data-changed", action="store_true",
                   help="rejudge exactly the problem's submissions judged with other test data than its digest now")
    p.add_argument("--status", help="rejudge every submission that ended with this verdict (system_error, say)")
    p.add_argument("--since", help="with --status: decided within this age (90s, 30m, 2h, 1d) or since this "
                                   "moment (ISO 8601)")
    p.set_defaults(func=cmd_rejudge)

    p = sub.add_parser("status", help="queue, leases in flight, workers")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("canary", help="canary submissions: known programs with a known verdict, credited to nobody")
    csub = p.add_subparsers(dest="canary_command", required=True)
    cr = csub.add_parser("run", help="cutover gate: a canary pinned to one worker, judged and checked; "
                                     "prints its timings, exits non-zero on any failure")
    cr.add_argument("--worker", dest="worker_id", required=True)
    cr.add_argument("--transport", choices=["arbiter", "direct"],
                    help="also require that the verdict came through this transport")
    cr.add_argument("--language", choices=sorted(canary.PROGRAMS), default="c")
    cr.add_argument("--timeout", type=float, default=120.0)
    cr.set_defaults(func=cmd_canary_run)
    p = sub.add_parser("leases", help="arbiter leases")
    lsub = p.add_subparsers(dest="leases_command", required=True)
    ld = lsub.add_parser("drain", help="reclaim expired arbiter leases (DB time) until none is live; "
                                      "for a rollback once no arbiter runs")
    ld.add_argument("--wait", type=float, default=120.0, help="give up after this many seconds (default 120)")
    ld.add_argument("--max-attempts", type=int, default=3, help="attempts before system_error (default 3)")
    ld.set_defaults(func=cmd_leases_drain)

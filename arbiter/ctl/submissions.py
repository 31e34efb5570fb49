"""judgectl: Submissions as the operator looks them up: submission show, submission list."""

from __future__ import annotations

from psycopg.rows import dict_row

from arbiter.ctl.common import OPS, InputError, parse_since
from arbiter.protocol.vocabulary import VerdictCode

# A submission's states: waiting, leased, and each verdict (the database's CHECK spells the same list).
STATUSES = ("pending", "judging", *(code.value for code in VerdictCode))

MAX_LIST = 10_000


def _when(value) -> str:
    return "-" if value is None else f"{value:%Y-%m-%d %H:%M:%S%z}"


def cmd_submission_show(args, conn) -> int:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(OPS.show_submission, {"submission_id": args.submission_id}).fetchone()
        if row is None:
            raise InputError(f"no submission #{args.submission_id}")
        judgings = cur.execute(OPS.submission_judgings_of, {"submission_id": args.submission_id}).fetchall()
    kind = f"canary (expects {row['canary_expect']})" if row["canary_expect"] else f"by {row['user_name']}"
    print(f"submission #{row['id']} {kind[:80]}: {row['problem']} in {row['language']} "
          f"({row['source_chars']} characters)")
    print(f"  status      {row['status']}")
    if row["status"] == "judging":
        slot = "" if row["lease_slot"] is None else f" slot {row['lease_slot']}"
        expires = "-" if row["expires_in_s"] is None else f"{row['expires_in_s']}s"
        print(f"  lease       gen {row['lease_gen']} on {row['worker_id'] or '-'}{slot}, expires in {expires}")
    print(f"  attempts    {row['judge_attempts']} (hand-backs {row['lease_releases']}), generation {row['lease_gen']}")
    print(f"  submitted   {_when(row['created_at'])}")
    print(f"  last leased {_when(row['leased_at'])}")
    print(f"  decided     {_when(row['judged_at'])}")
    print(f"judgings ({len(judgings)}):")
    if not judgings:
        print("  (none)")
    for j in judgings:
        slot = "" if j["slot"] is None else f"/{j['slot']}"
        took = "" if j["time_ms"] is None else f" {j['time_ms']} ms"
        memory = "" if j["memory_kb"] is None else f" {j['memory_kb']} KiB"
        data = f" data {j['data_digest'][:12]}" if j["data_digest"] else ""
        granted = f" leased {_when(j['granted_at'])}," if j["granted_at"] else ""
        print(f"  #{j['seq']} gen {j['lease_gen'] if j['lease_gen'] is not None else '-'} "
              f"{j['verdict']:<12} by {j['worker_id']}{slot} ({j['decided_by']}){took}{memory}{data};"
              f"{granted} decided {_when(j['created_at'])}")
    return 0


def cmd_submission_list(args, conn) -> int:
    if args.status is not None and args.status not in STATUSES:
        raise InputError(f"unknown status {args.status!r} (choose from {', '.join(STATUSES)})")
    if not 1 <= args.limit <= MAX_LIST:
        raise InputError(f"--limit must be between 1 and {MAX_LIST}")
    params = {"status": args.status, "slug": args.problem,
              "limit": args.limit, **parse_since(args.since)}
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(OPS.list_submissions, params).fetchall()
    for row in rows:
        print(f"#{row['id']:<8} {row['status']:<12} {row['problem']:<16} {row['language']:<8} "
              f"{row['user_name'][:20]:<20} gen {row['lease_gen']:<3} {row['worker_id'] or '-':<12} "
              f"submitted {_when(row['created_at'])}  decided {_when(row['judged_at'])}")
    print(f"{len(rows)} submission(s)" + (f" (the newest {args.limit}; --limit for more)"
                                           if len(rows) == args.limit else ""))
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("submission", help="look submissions up (read only)")
    ssub = p.add_subparsers(dest="submission_command", required=True)
    sh = ssub.add_parser("show", help="one submission: its state and every judging (worker, slot, verdict, "
                                      "times, test data); never a token")
    sh.add_argument("submission_id", type=int)
    sh.set_defaults(func=cmd_submission_show)
    sl = ssub.add_parser("list", help="the newest submissions matching the filters (canaries left out)")
    sl.add_argument("--status", help=f"one of {', '.join(STATUSES)}")
    sl.add_argument("--problem", help="the problem's slug")
    sl.add_argument("--since", help="submitted within this age (90s, 30m, 2h, 1d) or since this moment (ISO 8601)")
    sl.add_argument("--limit", type=int, default=50, help="at most this many, newest first (default 50)")
    sl.set_defaults(func=cmd_submission_list)

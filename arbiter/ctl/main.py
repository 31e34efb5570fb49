"""judgectl: the operator's command line (migrations, submissions, rejudge, status, leases, workers).

Errors are one clear line on stderr and a non-zero exit status.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tarfile
import tempfile
from pathlib import Path

import psycopg
from psycopg.rows import dict_row

from arbiter.errors import ArbiterError

# The worker's own parser: what judgectl stores is exactly what a worker accepts.
from arbiter.protocol import testdata  # noqa: E402
from arbiter.protocol.compare import ComparerError, parse_comparer  # noqa: E402
from arbiter.store import canary, credentials, dbroles, leases, migrations, status, testblobs
from arbiter.store.sqlfiles import Statements

OPS = Statements("operator.sql")
# How often the waiting commands (the cutover gate, the lease drain) look again: a gate passes within
# this much of the moment its condition holds; each look is one small indexed query.
POLL_SECS = 0.2
# How long a replaced worker credential stays valid: time to roll the new one out to the worker.
DEFAULT_OVERLAP_SECS = 3600.0


class CtlError(ArbiterError):
    pass


def _connect(dsn: str | None) -> psycopg.Connection:
    dsn = dsn or os.environ.get("JUDGE_DSN")
    if not dsn:
        raise CtlError("no database given: pass --dsn or set JUDGE_DSN")
    try:
        return psycopg.connect(dsn, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        raise CtlError(f"cannot connect to the database: {str(exc).strip().splitlines()[0]}") from None


def cmd_migrate(args, conn) -> int:
    done = migrations.migrate(conn, args.to)
    for line in done:
        print(line)
    if not done:
        print(f"nothing to do: schema is at version {migrations.current_version(conn)}")
    return 0


def cmd_schema_version(args, conn) -> int:
    print(migrations.current_version(conn))
    return 0


def _read_secret_arg(path: str, what: str) -> str:
    """A secret from a file or '-' (standard input): never from the command line, where ps would show it."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CtlError(f"cannot read {what} {path}: {exc.strerror}") from None
    text = text.strip()
    if not text:
        raise CtlError(f"{what} is empty")
    return text


def cmd_dbrole_ensure(args, conn) -> int:
    password = _read_secret_arg(args.password_file, "password")
    outcome = dbroles.ensure_login_role(conn, args.role, password, member_of=args.member_of)
    if args.arbiter and dbroles.grant_arbiter_privileges(conn, args.role) == "updated" and outcome == "unchanged":
        outcome = "updated"
    print(f"{outcome} role {args.role}")
    return 0


def cmd_dbrole_drop(args, conn) -> int:
    print(f"{dbroles.drop_login_role(conn, args.role)} role {args.role}")
    return 0


def _comparer_and_checker(args, default: str | None) -> tuple[str | None, str | None]:
    """--comparer and --checker as the database stores them: (comparer, checker_sha256)."""
    comparer = args.comparer
    if args.checker:
        if comparer not in (None, "checker"):
            raise CtlError(f"--checker makes the comparer 'checker', not {comparer!r}")
        try:
            digest = hashlib.sha256(Path(args.checker).read_bytes()).hexdigest()  # as worker/judging/checker.py
        except OSError as exc:
            raise CtlError(f"--checker {args.checker}: {exc.strerror}") from None
        return "checker", digest
    if comparer is None:
        return default, None
    if comparer == "checker":
        raise CtlError("--comparer checker needs --checker FILE (the checker's C++ source)")
    try:
        return str(parse_comparer(comparer)), None
    except ComparerError as exc:
        raise CtlError(str(exc)) from None


def _checker_reminder(problem_id: int, args) -> None:
    if args.checker:
        print(f"ship {args.checker} with the test data as {problem_id}/checker.cpp (with any *.h it includes); "
              "a worker judges only with a checker of this digest", file=sys.stderr)


def cmd_problem_add(args, conn) -> int:
    comparer, checker_sha256 = _comparer_and_checker(args, "tokens")
    try:
        row = conn.execute(OPS.add_problem, {"slug": args.slug, "title": args.title or args.slug,
                                             "xp_reward": args.xp, "time_limit_ms": args.time_limit_ms,
                                             "memory_limit_kb": args.memory_limit_kb, "comparer": comparer,
                                             "checker_sha256": checker_sha256}).fetchone()
    except psycopg.errors.UniqueViolation:
        raise CtlError(f"problem {args.slug!r} already exists") from None
    except psycopg.errors.CheckViolation as exc:
        raise CtlError(f"invalid problem: {exc.diag.message_primary}") from None
    print(row[0])
    _checker_reminder(row[0], args)
    return 0


def cmd_problem_set(args, conn) -> int:
    comparer, checker_sha256 = _comparer_and_checker(args, None)
    try:
        row = conn.execute(OPS.set_problem, {"slug": args.slug, "time_limit_ms": args.time_limit_ms,
                                             "memory_limit_kb": args.memory_limit_kb, "comparer": comparer,
                                             "checker_sha256": checker_sha256}).fetchone()
    except psycopg.errors.CheckViolation as exc:
        raise CtlError(f"invalid problem: {exc.diag.message_primary}") from None
    if row is None:
        raise CtlError(f"no problem {args.slug!r}")
    print(f"problem {args.slug} (#{row[0]}): comparer {row[1]}" + (f", checker sha256 {row[2]}" if row[2] else ""))
    _checker_reminder(row[0], args)
    return 0


def cmd_problem_data(args, conn) -> int:
    """A problem's test data (a directory, or a tar archive of one) into the database: its content
    (each file once, by its SHA-256) and its digest, which every worker then judges with."""
    source = Path(args.source)
    with tempfile.TemporaryDirectory(prefix="judgectl-data-") as scratch:
        if source.is_dir():
            root = source
        elif source.is_file():
            try:
                with tarfile.open(source) as archive:
                    archive.extractall(scratch, filter="data")
            except (tarfile.TarError, OSError) as exc:
                raise CtlError(f"{source}: not a readable tar archive of test data ({exc})") from None
            root = Path(scratch)
            inner = list(root.iterdir())
            if len(inner) == 1 and inner[0].is_dir():  # an archive of the directory itself
                root = inner[0]
        else:
            raise CtlError(f"{source}: no such directory or archive")
        try:
            entries = testdata.manifest(root)
        except OSError as exc:
            raise CtlError(f"{source}: {exc.strerror}") from None
        if not any(e.path.endswith(".in") for e in entries):
            raise CtlError(f"{source}: no .in files: not a problem's test data")
        if conn.execute(OPS.find_problem, {"slug": args.slug}).fetchone() is None:
            raise CtlError(f"no problem {args.slug!r}")
        digest = testdata.digest_of(entries)
        conn.execute(OPS.lock_test_data)
        try:
            stored = testblobs.store_data_set(conn, root, digest, entries)
        except (ValueError, OSError) as exc:
            raise CtlError(f"{source}: {exc}") from None
    row = conn.execute(OPS.set_problem_data_digest, {"slug": args.slug, "data_digest": digest}).fetchone()
    size = sum(e.size for e in entries)
    changed = "unchanged" if row[1] == digest else f"was {row[1][:12] if row[1] else 'unset'}"
    print(f"problem {args.slug} (#{row[0]}): test data {digest} ({len(entries)} files, {size} bytes, "
          f"{stored} bytes stored now; {changed})")
    if row[1] != digest:
        print(f"workers judge {args.slug} only with exactly this data (they fetch it from the arbiter); "
              f"then: judgectl rejudge --problem {args.slug} --data-changed", file=sys.stderr)
    return 0


def cmd_data_prune(args, conn) -> int:
    """Remove the stored test data that no problem uses now (older versions), and the files only
    they listed. The history keeps each judging's digest; only the content goes."""
    conn.execute(OPS.lock_test_data)
    unused = conn.execute(OPS.unused_data_sets).fetchall()
    for digest, files, size in unused:
        print(f"{'would remove' if args.dry_run else 'removing'} data set {digest} ({files} files, {size} bytes)")
    if args.dry_run:
        return 0
    with conn.transaction():
        conn.execute(OPS.prune_data_sets)
        freed = [row[0] for row in conn.execute(OPS.prune_blobs).fetchall()]
    print(f"removed {len(unused)} data set(s) and {len(freed)} file(s) no data set lists ({sum(freed)} bytes)")
    return 0


def cmd_submit(args, conn) -> int:
    if args.language not in leases.LANGUAGES:
        raise CtlError(f"unknown language {args.language!r} (choose from {', '.join(sorted(leases.LANGUAGES))})")
    try:
        raw = Path(args.source).read_bytes() if args.source != "-" else sys.stdin.buffer.read()
    except OSError as exc:
        raise CtlError(f"cannot read source {args.source}: {exc.strerror}") from None
    try:
        source = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CtlError(f"source {args.source} is not UTF-8 text (byte {exc.start}); nothing stored") from None
    try:
        leases.check_source(source)
    except leases.SourceRefused as exc:
        raise CtlError(f"source {args.source}: {exc}; nothing stored") from None
    problem = conn.execute(OPS.find_problem, {"slug": args.problem}).fetchone()
    if problem is None:
        raise CtlError(f"unknown problem {args.problem!r}")
    with conn.transaction():
        user_id = conn.execute(OPS.ensure_user, {"name": args.user}).fetchone()[0]
    print(leases.submit(conn, user_id, problem[0], args.language, source))
    return 0


def cmd_rejudge(args, conn) -> int:
    if args.data_changed:
        if not args.problem or args.submission_ids:
            raise CtlError("--data-changed goes with --problem SLUG and no submission ids")
        row = conn.execute(OPS.find_problem_digest, {"slug": args.problem}).fetchone()
        if row is None:
            raise CtlError(f"no problem {args.problem!r}")
        if row[0] is None:
            raise CtlError(f"problem {args.problem!r} has no test-data digest yet: set it with "
                           "'judgectl problem data' first")
        ids = [r[0] for r in conn.execute(OPS.judged_with_other_data, {"slug": args.problem}).fetchall()]
        if not ids:
            print(f"nothing to rejudge: every decided submission of {args.problem} was judged with {row[0][:12]}")
            return 0
        args.submission_ids = ids
    elif args.problem or not args.submission_ids:
        raise CtlError("give submission ids, or --problem SLUG --data-changed")
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
    import time

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


def _languages(arg: str) -> list[str]:
    languages = sorted(set(arg.split(",")))
    unknown = set(languages) - leases.LANGUAGES
    if unknown:
        raise CtlError(f"unknown language(s): {', '.join(sorted(unknown))}")
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
        raise CtlError("--overlap must be between 0 and 2592000 seconds (30 days)")
    return value


MAX_SLOTS = 256


def _slots(value: int) -> int:
    if not 1 <= value <= MAX_SLOTS:
        raise CtlError(f"--slots must be between 1 and {MAX_SLOTS}")
    return value


def cmd_worker_add(args, conn) -> int:
    if not credentials.WORKER_ID.match(args.worker_id):
        raise CtlError("worker id must be 1-63 chars of a-z, 0-9, '_' or '-', starting with a letter or digit")
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
    parsed = credentials.parse_credential(_read_secret_arg(args.credential_file, "credential"))
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


def cmd_canary_run(args, conn) -> int:
    """The cutover gate: a canary pinned to the worker, its verdict checked, one line with the timings.

    Needs no traffic (a quiet site passes in seconds) and proves the whole judging path of that one
    worker through that one transport; a wrong verdict fails in seconds, naming the verdict.
    """
    import time

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


def cmd_worker_revoke(args, conn) -> int:
    if conn.execute(OPS.revoke_worker, {"worker_id": args.worker_id}).rowcount == 0:
        raise CtlError(f"no active worker {args.worker_id!r}")
    print(f"revoked {args.worker_id}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="judgectl", description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", help="PostgreSQL connection string (default: $JUDGE_DSN)")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("migrate", help="apply or roll back migrations")
    p.add_argument("--to", help="baseline, stage1, stage4, latest or a version number (default: latest)")
    p.set_defaults(func=cmd_migrate)

    p = sub.add_parser("schema-version", help="print the schema version (1 baseline, 2 stage 0, 3 stage 1, 4 stage 4)")
    p.set_defaults(func=cmd_schema_version)

    p = sub.add_parser("dbrole", help="database login roles of the cutover (legacy workers, the arbiter)")
    dsub = p.add_subparsers(dest="dbrole_command", required=True)
    de = dsub.add_parser("ensure", help="create the login role or set its password; prints what it did")
    de.add_argument("role")
    de.add_argument("--password-file", required=True, help="file holding the password, or - for standard input")
    de.add_argument("--member-of", help="group role to grant (judge_legacy_worker for a legacy worker)")
    de.add_argument("--arbiter", action="store_true", help="grant the arbiter's table privileges")
    de.set_defaults(func=cmd_dbrole_ensure)
    dd = dsub.add_parser("drop", help="drop the login role and end its sessions")
    dd.add_argument("role")
    dd.set_defaults(func=cmd_dbrole_drop)

    p = sub.add_parser("problem", help="manage problems")
    psub = p.add_subparsers(dest="problem_command", required=True)
    pa = psub.add_parser("add")
    pa.add_argument("slug")
    pa.add_argument("--title")
    pa.add_argument("--xp", type=int, default=10)
    pa.add_argument("--time-limit-ms", type=int, default=1000)
    pa.add_argument("--memory-limit-kb", type=int, default=262144)
    pa.add_argument("--comparer", help="tokens (default) | lines | float:abs=A,rel=R | checker")
    pa.add_argument("--checker", help="the problem's checker (C++ source, testlib convention); implies --comparer checker")
    pa.set_defaults(func=cmd_problem_add)
    ps = psub.add_parser("set", help="change a problem's limits, comparer or checker (only what is given)")
    ps.add_argument("slug")
    ps.add_argument("--time-limit-ms", type=int)
    ps.add_argument("--memory-limit-kb", type=int)
    ps.add_argument("--comparer", help="tokens | lines | float:abs=A,rel=R | checker")
    ps.add_argument("--checker", help="the problem's checker (C++ source); implies --comparer checker")
    ps.set_defaults(func=cmd_problem_set)
    pd = psub.add_parser("data", help="record the digest of a problem's test data (a directory or a tar of one)")
    pd.add_argument("slug")
    pd.add_argument("source", help="the test data: DIR or ARCHIVE (.tar, .tar.gz)")
    pd.set_defaults(func=cmd_problem_data)

    p = sub.add_parser("data", help="stored test data")
    tsub = p.add_subparsers(dest="data_command", required=True)
    dp = tsub.add_parser("prune", help="remove stored test data no problem uses now (older versions)")
    dp.add_argument("--dry-run", action="store_true", help="say what would go, remove nothing")
    dp.set_defaults(func=cmd_data_prune)

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
    wr = wsub.add_parser("revoke", help="revoke a worker's credentials (the current one and any previous one)")
    wr.add_argument("worker_id")
    wr.set_defaults(func=cmd_worker_revoke)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with _connect(args.dsn) as conn:
            return args.func(args, conn)
    except (CtlError, migrations.MigrationError) as exc:
        print(f"judgectl: error: {exc}", file=sys.stderr)
        return 1
    except psycopg.errors.UndefinedTable as exc:
        print(f"judgectl: error: schema not ready ({exc.diag.message_primary}); run 'judgectl migrate'",
              file=sys.stderr)
        return 1
    except psycopg.OperationalError as exc:
        print(f"judgectl: error: database: {str(exc).strip().splitlines()[0]}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

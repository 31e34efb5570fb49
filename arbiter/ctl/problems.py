"""judgectl: Problems and their test data: problem add/set/data, data prune."""

from __future__ import annotations

import hashlib
import sys
import tarfile
import tempfile
from pathlib import Path

import psycopg
from psycopg.rows import dict_row

from arbiter.ctl.common import OPS, CtlError, InputError, check_slug

# The seam's own digest and comparer parser: what judgectl stores is exactly what a worker accepts.
from arbiter.protocol import testdata
from arbiter.protocol.compare import ComparerError, parse_comparer
from arbiter.store import testblobs


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
    check_slug(args.slug)
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
                # tarfile's message lists every compression it tried, a line each: the first line says it.
                why = str(exc).strip().splitlines()[0].rstrip(":") if str(exc).strip() else type(exc).__name__
                raise InputError(f"{source}: a file, but not a tar archive of test data ({why}); give the "
                                 "test data's directory or a .tar/.tar.gz of it") from None
            root = Path(scratch)
            inner = list(root.iterdir())
            if len(inner) == 1 and inner[0].is_dir():  # an archive of the directory itself
                root = inner[0]
        else:
            raise InputError(f"{source}: no such directory or archive")
        try:
            entries = testdata.manifest(root)
        except OSError as exc:
            raise CtlError(f"{source}: {exc.strerror}") from None
        if not any(e.path.endswith(".in") for e in entries):
            raise InputError(f"{source}: no .in files: not a problem's test data")
        if conn.execute(OPS.find_problem, {"slug": args.slug}).fetchone() is None:
            raise InputError(f"no problem {args.slug!r}")
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

def cmd_problem_list(args, conn) -> int:
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(OPS.list_problems).fetchall()
    for row in rows:
        data = row["data_digest"][:12] if row["data_digest"] else "no data"
        print(f"{row['slug']:<20} #{row['id']:<5} {row['time_limit_ms']:>6} ms {row['memory_limit_kb'] // 1024:>6} MiB "
              f"{row['comparer']:<14} {data:<12} pending {row['pending']:<5} judging {row['judging']:<4} "
              f"{row['title'][:40]}")
    print(f"{len(rows)} problem(s)")
    return 0


def cmd_problem_show(args, conn) -> int:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(OPS.show_problem, {"slug": args.slug}).fetchone()
        if row is None:
            raise InputError(f"no problem {args.slug!r} (judgectl problem list)")
        counts = cur.execute(OPS.problem_status_counts, {"problem_id": row["id"]}).fetchall()
    print(f"problem {row['slug']} (#{row['id']}): {row['title']}")
    print(f"  limits      {row['time_limit_ms']} ms, {row['memory_limit_kb']} KiB")
    checker = f" (checker sha256 {row['checker_sha256']})" if row["checker_sha256"] else ""
    print(f"  comparer    {row['comparer']}{checker}")
    print(f"  test data   {row['data_digest'] or 'none yet (judgectl problem data)'}")
    print(f"  xp reward   {row['xp_reward']}")
    print("  submissions " + (", ".join(f"{c['status']} {c['count']}" for c in counts) or "none"))
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


def add_commands(sub) -> None:
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
    pl = psub.add_parser("list", help="every problem: limits, comparer, test data, live work")
    pl.set_defaults(func=cmd_problem_list)
    pw = psub.add_parser("show", help="one problem: limits, comparer, checker, test data, submissions by status")
    pw.add_argument("slug")
    pw.set_defaults(func=cmd_problem_show)
    pd = psub.add_parser("data", help="record the digest of a problem's test data (a directory or a tar of one)")
    pd.add_argument("slug")
    pd.add_argument("source", help="the test data: DIR or ARCHIVE (.tar, .tar.gz)")
    pd.set_defaults(func=cmd_problem_data)

    p = sub.add_parser("data", help="stored test data")
    tsub = p.add_subparsers(dest="data_command", required=True)
    dp = tsub.add_parser("prune", help="remove stored test data no problem uses now (older versions)")
    dp.add_argument("--dry-run", action="store_true", help="say what would go, remove nothing")
    dp.set_defaults(func=cmd_data_prune)

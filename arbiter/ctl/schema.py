"""judgectl: Schema and database roles: migrate, schema-version, dbrole."""

from __future__ import annotations

from arbiter.ctl.common import read_secret_arg

# The worker's own parser: what judgectl stores is exactly what a worker accepts.
from arbiter.store import dbroles, migrations


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

def cmd_dbrole_ensure(args, conn) -> int:
    password = read_secret_arg(args.password_file, "password")
    outcome = dbroles.ensure_login_role(conn, args.role, password, member_of=args.member_of)
    if args.arbiter and dbroles.grant_arbiter_privileges(conn, args.role) == "updated" and outcome == "unchanged":
        outcome = "updated"
    print(f"{outcome} role {args.role}")
    return 0

def cmd_dbrole_drop(args, conn) -> int:
    print(f"{dbroles.drop_login_role(conn, args.role)} role {args.role}")
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("migrate", help="apply or roll back migrations")
    p.add_argument("--to", help="baseline, stage1, stage4, latest or a version number (default: latest)")
    p.set_defaults(func=cmd_migrate)

    p = sub.add_parser("schema-version", help="print the schema version (1 baseline, 2 stage 0, 3 stage 1, 5 stage 4)")
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

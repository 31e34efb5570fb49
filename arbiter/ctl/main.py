"""judgectl: the operator's command line (migrations, submissions, rejudge, status, leases, workers).

Errors are one clear line on stderr and a non-zero exit status. One module per command group:
schema.py, problems.py, queue.py, workers.py; common.py holds what they share.
"""

from __future__ import annotations

import argparse
import sys

import psycopg

from arbiter.ctl import problems, queue, schema, workers
from arbiter.ctl.common import CtlError, connect
from arbiter.store import migrations


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="judgectl", description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", help="PostgreSQL connection string (default: $JUDGE_DSN)")
    sub = parser.add_subparsers(dest="command", required=True)
    for group in (schema, problems, queue, workers):
        group.add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with connect(args.dsn) as conn:
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

"""judgectl: the operator's command line (migrations, submissions, rejudge, status, leases, workers).

Errors are one clear line on stderr: exit 2 for what was typed wrong (as argparse's own), 1 for what
could not be done. One module per command group: schema.py, problems.py, queue.py, submissions.py,
workers.py; common.py holds what they share.
"""

from __future__ import annotations

import argparse
import sys

import psycopg

from arbiter.ctl import problems, queue, schema, submissions, workers
from arbiter.ctl.common import CtlError, InputError, connect
from arbiter.store import migrations


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="judgectl", description=__doc__.splitlines()[0])
    dsn_help = "PostgreSQL connection string (default: $JUDGE_DSN)"
    parser.add_argument("--dsn", help=dsn_help)
    sub = parser.add_subparsers(dest="command", required=True)
    for group in (schema, problems, queue, submissions, workers):
        group.add_commands(sub)
    # --dsn before the sub-command or after it: every command takes it too (SUPPRESS: not given
    # there, it leaves what was given before the sub-command alone).
    for leaf in _leaves(parser):
        leaf.add_argument("--dsn", help=dsn_help, default=argparse.SUPPRESS)
    return parser


def _leaves(parser: argparse.ArgumentParser):
    """The parsers of the commands themselves (those with no sub-commands of their own)."""
    groups = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not groups:
        yield parser
    for group in groups:
        for child in dict.fromkeys(group.choices.values()):  # an alias maps to the same parser
            yield from _leaves(child)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with connect(args.dsn) as conn:
            return args.func(args, conn)
    except InputError as exc:
        print(f"judgectl: error: {exc}", file=sys.stderr)
        return 2
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

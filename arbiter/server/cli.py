"""judge-arbiter: run the arbiter under gunicorn with the packaged gunicorn.conf.py."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from arbiter.server.config import ConfigError, load_settings
from arbiter.server.serving import APP


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="judge-arbiter", description=__doc__)
    parser.add_argument("--config", help="TOML config file (default: $JUDGE_ARBITER_CONFIG)")
    parser.add_argument("--check-config", action="store_true", help="validate the config and exit")
    args = parser.parse_args(argv)
    if args.config:
        os.environ["JUDGE_ARBITER_CONFIG"] = os.path.abspath(args.config)
    try:
        settings = load_settings()
    except ConfigError as exc:
        print(f"judge-arbiter: config error: {exc}", file=sys.stderr)
        return 2
    if args.check_config:
        print(f"config ok: bind {settings.bind}, max_parked {settings.max_parked}, db_threads {settings.db_threads}")
        return 0
    conf = Path(__file__).with_name("gunicorn.conf.py")
    gunicorn = [sys.executable, "-m", "gunicorn", "-c", str(conf), APP]
    os.execv(sys.executable, gunicorn)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())

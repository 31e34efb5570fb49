"""Loads the project's SQL: numbered migrations and files of named statements.

The files ship inside the wheel as ``arbiter/sql`` (see pyproject.toml). In a
source checkout without an installed wheel they are read from ``sql/`` beside
the package, which is the same directory the wheel is built from.
"""

from __future__ import annotations

import functools
import re
from importlib import resources
from pathlib import Path

_NAME_LINE = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)


def sql_root() -> Path:
    packaged = resources.files("arbiter").joinpath("sql")
    if packaged.is_dir():
        return Path(str(packaged))
    checkout = Path(__file__).resolve().parents[2] / "sql"
    if checkout.is_dir():
        return checkout
    raise FileNotFoundError("the arbiter's SQL files are missing: neither arbiter/sql nor ../sql exists")


def parse_named_statements(text: str, origin: str) -> dict[str, str]:
    """Split a file of ``-- name: x`` blocks into {name: statement}."""
    matches = list(_NAME_LINE.finditer(text))
    if not matches:
        raise ValueError(f"{origin}: no '-- name:' blocks found")
    statements: dict[str, str] = {}
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(text)
        body = text[match.end():end].strip()
        name = match.group(1)
        if name in statements:
            raise ValueError(f"{origin}: statement {name!r} is defined twice")
        if not body:
            raise ValueError(f"{origin}: statement {name!r} is empty")
        statements[name] = body.rstrip().rstrip(";")
    return statements


class Statements:
    """Named statements of one SQL file, accessed as attributes: ``Q.acquire_lease``."""

    def __init__(self, filename: str):
        path = sql_root() / filename
        self._by_name = parse_named_statements(path.read_text(encoding="utf-8"), str(path))

    def __getattr__(self, name: str) -> str:
        try:
            return self._by_name[name]
        except KeyError:
            raise AttributeError(f"no SQL statement named {name!r}") from None

    def names(self) -> list[str]:
        return sorted(self._by_name)


@functools.cache
def arbiter_statements() -> Statements:
    return Statements("queries.sql")


@functools.cache
def legacy_statements() -> Statements:
    return Statements("legacy.sql")

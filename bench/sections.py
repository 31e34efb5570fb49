"""docs/benchmarks.md is written by several commands: bench/run.py owns the file, each of
SECTION_SCRIPTS owns one section between its markers. Each keeps the others' parts as they
were written."""

from __future__ import annotations

from pathlib import Path

SECTION_SCRIPTS = ("judge.py", "scale.py", "data.py", "slots.py", "ha.py")


def markers(script: str) -> tuple[str, str]:
    return f"<!-- bench/{script}: begin -->", f"<!-- bench/{script}: end -->"


def section(old: str, script: str) -> str | None:
    """That script's section of ``old`` (markers included), or None."""
    begin, end = markers(script)
    if begin in old and end in old:
        return old[old.index(begin):old.index(end) + len(end)]
    return None


def write_section(path: str | Path, script: str, text: str) -> None:
    """Put ``text`` (with the script's markers, ending in a newline) in place of the script's
    section, or after everything if it has none yet."""
    path = Path(path)
    old = path.read_text() if path.exists() else ""
    begin, end = markers(script)
    if section(old, script) is not None:
        new = old[:old.index(begin)] + text + old[old.index(end) + len(end) + 1:]
    else:
        new = old.rstrip("\n") + "\n\n" + text
    path.write_text(new)


def publish(path: str | Path | None, script: str, lines: list[str]) -> None:
    """Print a finished section (its lines, markers included) and, given a path, write it there."""
    text = "\n".join(lines) + "\n"
    print(text)
    if path:
        write_section(path, script, text)

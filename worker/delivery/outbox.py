"""The durable outbox: every result is on disk, with its lease token, before any delivery attempt.

Writes are atomic and durable: temp file, fsync, rename, fsync of the directory.
A file that cannot be read back is moved to ``corrupt/`` with a log line and
never stops the worker.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

log = logging.getLogger("worker.outbox")


@dataclass(frozen=True)
class Entry:
    transport: str  # "arbiter": delivered with lease_token; "direct": the legacy report
    submission_id: int
    verdict: str
    lease_token: str | None = None
    lease_gen: int | None = None
    time_ms: int | None = None
    memory_kb: int | None = None
    detail: dict = field(default_factory=dict)
    data_digest: str | None = None  # the test data judged with (recorded in the history row)
    created_at: float = field(default_factory=time.time)
    entry_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def filename(self) -> str:
        return f"{int(self.created_at * 1000):015d}-{self.submission_id}-{self.entry_id}.json"

    def with_minimal_detail(self, why: str) -> "Entry":
        """The same result (verdict, time, memory, the failed test's number) without the rest of its detail."""
        from worker.judging.detail_budget import minimal

        return replace(self, detail=minimal(self.detail, why))

    def result_payload(self) -> dict:
        payload = {"lease_token": self.lease_token, "verdict": self.verdict, "time_ms": self.time_ms,
                   "memory_kb": self.memory_kb, "detail": self.detail}
        if self.data_digest:
            payload["data_digest"] = self.data_digest
        return payload


def _read_entry(path: Path) -> Entry:
    """An entry read back from its file; ValueError, TypeError or UnicodeDecodeError if it cannot be."""
    entry = Entry(**json.loads(path.read_text(encoding="utf-8")))
    if not isinstance(entry.submission_id, int) or not isinstance(entry.verdict, str):
        raise ValueError("bad field types")
    return entry


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Outbox:
    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.corrupt_dir = self.directory / "corrupt"
        self.rejected_dir = self.directory / "rejected"
        # Judge slots write and deliver concurrently: pending() removes half-written files, which must
        # never be another slot's write in progress.
        self._lock = threading.Lock()

    def put(self, entry: Entry) -> Path:
        with self._lock:
            return self._put(entry)

    def _put(self, entry: Entry, directory: Path | None = None) -> Path:
        directory = directory or self.directory
        final = directory / entry.filename
        tmp = directory / f".{entry.filename}.tmp"
        data = json.dumps(asdict(entry), sort_keys=True).encode()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            written = 0
            while written < len(data):  # a nearly full disk may take part of a write without an error
                written += os.write(fd, data[written:])
            os.fsync(fd)
        except OSError:
            os.close(fd)
            try:
                tmp.unlink(missing_ok=True)  # never renamed: nothing was promised
            except OSError:
                pass  # a read-only disk keeps it; the next pending() removes it
            raise
        os.close(fd)
        os.rename(tmp, final)
        _fsync_dir(directory)
        return final

    def pending(self) -> list[tuple[Path, Entry]]:
        """Entries waiting for delivery, oldest first. Corrupt files are moved aside."""
        with self._lock:
            return self._pending()

    def _pending(self) -> list[tuple[Path, Entry]]:
        for stale in self.directory.glob(".*.tmp"):
            # A crash between write and rename: the result was never complete, so it was never acknowledged.
            try:
                stale.unlink(missing_ok=True)
                log.warning("removed an incomplete outbox write", extra={"file": stale.name})
            except OSError as exc:  # a read-only disk: harmless (never read), removed on a later pass
                log.warning("cannot remove an incomplete outbox write yet", extra={"file": stale.name,
                                                                                   "error": str(exc)[:200]})
        entries = []
        for path in sorted(self.directory.glob("*.json")):
            try:
                entry = _read_entry(path)
            except (ValueError, TypeError, UnicodeDecodeError) as exc:
                if self._try_move(path, self.corrupt_dir):
                    log.error("corrupt outbox file moved aside", extra={"file": path.name, "error": str(exc)[:200]})
                continue
            entries.append((path, entry))
        return entries

    def rewrite(self, path: Path, entry: Entry) -> bool:
        """Replace the entry at ``path`` (in the outbox or in rejected/) with ``entry``: the same result
        with a changed payload, atomically, in the same file. A disk that refuses (full, read-only)
        keeps the entry as it was: False, and the caller sends the new payload all the same (the same
        verdict; the kept one is shrunk again on a later pass)."""
        with self._lock:
            assert path.name == entry.filename, "an entry keeps its file"
            try:
                self._put(entry, path.parent)
            except OSError as exc:
                log.warning("an outbox entry could not be rewritten: its disk refused; the entry stays as it was",
                            extra={"file": path.name, "error": str(exc)[:200]})
                return False
            return True

    def rejected(self) -> list[tuple[Path, Entry | None]]:
        """The entries kept in rejected/ (None for one that cannot be read), oldest first."""
        found = []
        for path in sorted(self.rejected_dir.glob("*.json")) if self.rejected_dir.is_dir() else []:
            try:
                found.append((path, _read_entry(path)))
            except (ValueError, TypeError, UnicodeDecodeError):
                found.append((path, None))
        return found

    def clear(self, path: Path) -> bool:
        """Forget a delivered entry. A disk that refuses (read-only, failing) keeps it: False, and it is
        sent again on a later pass, where the arbiter answers a repeat as the first time (or 410)."""
        try:
            path.unlink(missing_ok=True)
            _fsync_dir(path.parent)
        except OSError as exc:
            log.warning("a delivered result stays in the outbox: its disk refused the removal; it is sent "
                        "again later and answered as before", extra={"file": path.name, "error": str(exc)[:200]})
            return False
        return True

    def reject(self, path: Path, reason: str) -> None:
        """Keep an entry that can never be delivered (a bug, not an outage) for an operator to look at."""
        if self._try_move(path, self.rejected_dir):
            log.error("outbox entry rejected", extra={"file": path.name, "reason": reason})

    def _try_move(self, path: Path, directory: Path) -> bool:
        """_move, or where the disk refuses it: the entry stays where it is (and is looked at again on
        the next pass); the refusal is logged, never raised into the slot that delivers."""
        try:
            self._move(path, directory)
        except OSError as exc:
            log.error("cannot move an outbox entry aside: its disk refused; it stays for the next pass",
                      extra={"file": path.name, "to": directory.name, "error": str(exc)[:200]})
            return False
        return True

    def _move(self, path: Path, directory: Path) -> None:
        directory.mkdir(exist_ok=True, mode=0o700)
        os.replace(path, directory / path.name)
        _fsync_dir(self.directory)
        _fsync_dir(directory)

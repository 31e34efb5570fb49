"""The worker's test-data cache: content-addressed files fetched from the arbiter, verified, reused.

``<data_dir>/blobs/<sha256>`` holds each file once; ``<data_dir>/sets/<digest>/`` is a data set laid
out as the judge reads it (hard links to the blobs), complete once it exists (it is built aside and
renamed). A file comes from, in order: the cache; the directory Ansible shipped (a pre-warmed copy,
used when its size and SHA-256 match); the arbiter (``GET /v1/blobs/<sha256>``), streamed to a
``.part`` file 64 KiB at a time and resumed from where a cut download stopped (``Range``). Every file's
SHA-256 is checked before it enters the cache, so nothing unverified is ever judged with. Memory
stays flat whatever the size of the data. The cache keeps to ``max_bytes``: after a new set is laid
out, the sets used longest ago go first, then every file no set links to any more (a blob whose
link count is 1); the set just laid out always stays.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import os
import re
import shutil
import threading
from pathlib import Path

from arbiter.protocol.testdata import file_sha256
from worker.delivery.http_client import ArbiterClient, Unreachable
from worker.errors import WorkerError

log = logging.getLogger("worker.data")
_HEX64 = re.compile(r"[0-9a-f]{64}")
READ_BYTES = 64 * 1024


class DataUnavailable(WorkerError):
    """The data set cannot be had now (arbiter unreachable, unknown digest, a file that does not verify).
    ``transient``: the arbiter could not be asked or could not answer now (down, cut off, its database
    away): asking again later may work. Otherwise the answer was no (unknown digest, a file that does
    not verify, a malformed listing) and asking again changes nothing."""

    def __init__(self, message: str, transient: bool = False):
        super().__init__(message)
        self.transient = transient


def _safe_relative(path: str) -> bool:
    p = Path(path)
    return bool(path) and not p.is_absolute() and ".." not in p.parts and "\x00" not in path


class DataStore:
    def __init__(self, data_dir: Path, client: ArbiterClient, prewarmed_dir: Path | None = None,
                 max_bytes: int = 10 << 30):
        self.root = Path(data_dir)
        self.max_bytes = max_bytes
        self.blobs = self.root / "blobs"
        self.sets = self.root / "sets"
        self.client = client
        self.prewarmed_dir = prewarmed_dir
        self._lock = threading.Lock()
        # Sets a judge slot is judging with (ensure .. release): never evicted meanwhile.
        self._held: collections.Counter[str] = collections.Counter()

    def ensure(self, problem_id: int, digest: str) -> Path:
        """The directory of data set ``digest``, fetched if need be, held until :meth:`release`.
        Raises DataUnavailable."""
        if not _HEX64.fullmatch(digest or ""):
            raise DataUnavailable(f"not a data digest: {digest!r}")
        target = self.sets / digest
        with self._lock:
            if target.is_dir():
                os.utime(target)  # used now: the last to be evicted
                self._held[digest] += 1
                return target
            files = self._listing(digest)
            self.blobs.mkdir(parents=True, exist_ok=True)
            for entry in files:
                self._obtain(problem_id, entry)
            laid_out = self._lay_out(digest, files)
            self._held[digest] += 1
            self._evict()
            return laid_out

    def release(self, digest: str) -> None:
        """The judging that ensured ``digest`` is over: the set may be evicted again."""
        with self._lock:
            self._held[digest] -= 1
            if self._held[digest] <= 0:
                del self._held[digest]

    def _evict(self) -> None:
        def blob_bytes() -> int:
            return sum(p.stat().st_size for p in self.blobs.iterdir() if p.is_file() and _HEX64.fullmatch(p.name))

        total = blob_bytes()
        if total <= self.max_bytes:
            return
        others = sorted((d for d in self.sets.iterdir() if d.is_dir() and d.name not in self._held and _HEX64.fullmatch(d.name)),
                        key=lambda d: d.stat().st_mtime)
        for old in others:
            if total <= self.max_bytes:
                break
            shutil.rmtree(old)
            for blob in list(self.blobs.iterdir()):
                if _HEX64.fullmatch(blob.name) and blob.stat().st_nlink == 1:
                    blob.unlink()
            total = blob_bytes()
            log.info("test data set evicted from the cache", extra={"digest": old.name, "cache_bytes": total})

    def _listing(self, digest: str) -> list[dict]:
        try:
            reply = self.client.request("GET", f"/v1/data/{digest}", lease_traffic=True)
        except Unreachable as exc:
            raise DataUnavailable(f"test data {digest[:12]}: arbiter unreachable ({exc})", transient=True) from None
        if reply.status != 200 or not isinstance(reply.body, dict):
            raise DataUnavailable(f"test data {digest[:12]}: the arbiter answered {reply.status}",
                                  transient=reply.status >= 500 or reply.status == 429)
        files = reply.body.get("files")
        if not isinstance(files, list) or not files:
            raise DataUnavailable(f"test data {digest[:12]}: empty listing")
        for entry in files:
            if not (isinstance(entry, dict) and isinstance(entry.get("path"), str) and _safe_relative(entry["path"])
                    and isinstance(entry.get("size"), int) and entry["size"] >= 0
                    and isinstance(entry.get("sha256"), str) and _HEX64.fullmatch(entry["sha256"])):
                raise DataUnavailable(f"test data {digest[:12]}: a malformed entry in its listing")
        return files

    def _obtain(self, problem_id: int, entry: dict) -> None:
        blob = self.blobs / entry["sha256"]
        if blob.is_file():
            return
        if self.prewarmed_dir is not None:
            shipped = self.prewarmed_dir / str(problem_id) / entry["path"]
            try:
                if shipped.is_file() and shipped.stat().st_size == entry["size"] and file_sha256(shipped) == entry["sha256"]:
                    tmp = blob.with_name(blob.name + ".copy")
                    shutil.copyfile(shipped, tmp)
                    os.replace(tmp, blob)
                    return
            except OSError:
                pass  # unreadable: fetch it instead
        self._download(entry, blob)

    def _download(self, entry: dict, blob: Path) -> None:
        part = blob.with_name(blob.name + ".part")
        h = hashlib.sha256()
        have = 0
        if part.exists():  # a download that was cut: what arrived counts, after checking it against the size
            have = part.stat().st_size
            if have > entry["size"]:
                part.unlink()
                have = 0
            else:
                with open(part, "rb") as f:
                    for chunk in iter(lambda: f.read(1 << 20), b""):
                        h.update(chunk)
        try:
            with open(part, "ab") as out:  # made here even for an empty file, which has no chunk to write
                if have < entry["size"]:
                    for chunk in self.client.download(f"/v1/blobs/{entry['sha256']}", have, READ_BYTES):
                        out.write(chunk)
                        h.update(chunk)
                        have += len(chunk)
                        if have > entry["size"]:
                            break
        except Unreachable as exc:
            raise DataUnavailable(f"test file {entry['path']}: {exc} ({have} of {entry['size']} bytes kept "
                                  "to resume)", transient=True) from None
        if have < entry["size"]:
            # The stream ended early without an error (http.client's read(n) returns b"" when the
            # server dies mid-body): a cut like any other, and what arrived is kept.
            raise DataUnavailable(f"test file {entry['path']}: the stream ended early ({have} of "
                                  f"{entry['size']} bytes kept to resume)", transient=True)
        if have != entry["size"] or h.hexdigest() != entry["sha256"]:
            part.unlink(missing_ok=True)  # never kept: the next try starts afresh
            raise DataUnavailable(f"test file {entry['path']} does not verify ({have} bytes; sha256 "
                                  f"{h.hexdigest()[:12]}, expected {entry['sha256'][:12]})")
        os.replace(part, blob)
        log.info("test file fetched", extra={"path": entry["path"], "bytes": have})

    def _lay_out(self, digest: str, files: list[dict]) -> Path:
        building = self.sets / f".{digest}.{os.getpid()}"
        shutil.rmtree(building, ignore_errors=True)
        for entry in files:
            dest = building / entry["path"]
            dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(self.blobs / entry["sha256"], dest)
            except OSError:
                shutil.copyfile(self.blobs / entry["sha256"], dest)
        for d in [building, *building.rglob("*")]:
            os.chmod(d, 0o755 if d.is_dir() else 0o644)
        target = self.sets / digest
        os.replace(building, target)
        return target

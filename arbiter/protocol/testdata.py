"""A problem's test data as a digest: what the database says it is, and what a worker's copy is.

The digest is the SHA-256 of a canonical listing of the problem's directory (every regular file,
recursively, sorted by its relative path's UTF-8 bytes): one line ``<sha256>  <size>  <path>`` per
file. ``judgectl problem data`` stores it (``problems.data_digest``); a lease carries it; a worker
whose copy has another digest does not judge with it (worker/judging/judge.py) and every history row
records the digest it was judged with. Hashing a large data set takes time, so a worker keeps the
digest of a directory as long as no file in it changed (name, size, mtime, inode).
"""

from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class FileEntry:
    path: str
    size: int
    sha256: str


def file_sha256(path: Path) -> str:
    """A file's SHA-256, read in 1 MiB pieces: how test data, checkers and fetched files are named."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _files(directory: Path) -> list[Path]:
    out = []
    for root, dirs, names in os.walk(directory):
        dirs.sort()
        for name in names:
            path = Path(root) / name
            if path.is_file() and not path.is_symlink():
                out.append(path)
    return sorted(out, key=lambda p: p.relative_to(directory).as_posix().encode("utf-8"))


def manifest(directory: str | os.PathLike) -> list[FileEntry]:
    d = Path(directory)
    return [FileEntry(p.relative_to(d).as_posix(), p.stat().st_size, file_sha256(p)) for p in _files(d)]


def digest_of(entries: list[FileEntry]) -> str:
    listing = "".join(f"{e.sha256}  {e.size}  {e.path}\n" for e in entries)
    return hashlib.sha256(listing.encode("utf-8")).hexdigest()


def directory_digest(directory: str | os.PathLike) -> str:
    return digest_of(manifest(directory))


class DigestCache:
    """Digests of test-data directories, computed again only when a file in one changed."""

    def __init__(self):
        self._lock = threading.Lock()
        self._known: dict[str, tuple[tuple, str]] = {}

    @staticmethod
    def _signature(directory: Path) -> tuple:
        sig = []
        for p in _files(directory):
            st = p.stat()
            sig.append((p.relative_to(directory).as_posix(), st.st_size, st.st_mtime_ns, st.st_ino))
        return tuple(sig)

    def digest(self, directory: Path) -> str:
        key = str(directory)
        signature = self._signature(directory)
        with self._lock:
            known = self._known.get(key)
        if known and known[0] == signature:
            return known[1]
        value = directory_digest(directory)
        with self._lock:
            self._known[key] = (signature, value)
        return value

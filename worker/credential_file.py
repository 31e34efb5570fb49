"""The worker's arbiter credential, read again whenever its file is replaced.

A rotation (``judgectl worker rotate`` / ``worker ensure`` with a new credential) keeps the previous
secret valid for an overlap; the operator (or the worker role) then writes the new credential into
the file. The next request sends it: no restart, no refused request. A replacement that is not a
usable credential (unreadable, readable by others, for another worker, empty) is logged once and the
credential in use is kept, so a botched copy cannot take the worker off the air.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from arbiter.protocol.configfiles import read_secret_file
from worker.errors import WorkerError

log = logging.getLogger("judge.worker")


class CredentialError(WorkerError):
    pass


def check_credential(text: str, worker_id: str) -> str:
    if not text.startswith(worker_id + ".") or len(text) <= len(worker_id) + 1 or any(c.isspace() for c in text):
        raise CredentialError(f"holds a credential for another worker, not {worker_id!r}")
    return text


class CredentialFile:
    def __init__(self, path: str | os.PathLike, worker_id: str):
        self.path = Path(path)
        self.worker_id = worker_id
        self._lock = threading.Lock()
        self._stamp = self._stat()
        self._value = check_credential(read_secret_file(str(self.path), "credential_file", CredentialError), worker_id)
        self._refused_stamp = None

    def _stat(self):
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size, st.st_mode)

    def current(self) -> str:
        """The credential to send now: one stat per call; a read only when the file changed."""
        stamp = self._stat()
        with self._lock:
            if stamp is None or stamp == self._stamp or stamp == self._refused_stamp:
                return self._value
            try:
                value = check_credential(read_secret_file(str(self.path), "credential_file", CredentialError),
                                         self.worker_id)
            except CredentialError as exc:
                self._refused_stamp = stamp
                log.error("credential file changed but is not usable; keeping the credential in use",
                          extra={"error": f"credential_file {self.path}: {exc}"[:300]})
                return self._value
            changed = value != self._value
            self._value, self._stamp, self._refused_stamp = value, stamp, None
        if changed:
            log.info("credential file replaced; sending the new credential", extra={"path": str(self.path)})
        return self._value

"""Clock jumps for one process at a time (the chaos run's ``clock_jump`` nemesis).

A process started with ``Clocks.env(name)`` runs under Debian's libfaketime: its CLOCK_REALTIME
(``time.time()``, ``datetime.now()``, log stamps) is off by what its clock file says, read again at
most once a second; CLOCK_MONOTONIC is left alone (``FAKETIME_DONT_FAKE_MONOTONIC``), as a real
step of the wall clock (an NTP correction, a wrong RTC after a reboot) leaves it. Only the
database's ``now()`` may decide a lease (docs/design.md, principle 7): a jump of an arbiter's or a
worker's clock by an hour either way must cost nothing.

clock_shim.c is preloaded before libfaketime to keep Python 3.11's ``time.sleep`` working under it
(its comment says why).
"""

from __future__ import annotations

import glob
import os
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
# How often a faked process reads its clock file again: a jump takes effect within this long.
REREAD_SECS = 1


def libfaketime() -> str:
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    if not found:
        raise RuntimeError("libfaketime is not installed (apt-get install libfaketime; .ci/setup does)")
    return found[0]


class Clocks:
    def __init__(self, root: Path):
        self.root = Path(root) / "clocks"
        self.root.mkdir(parents=True, exist_ok=True)
        self.shim = self.root / "clock_shim.so"
        subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-o", str(self.shim), str(HERE / "clock_shim.c")],
                       check=True, capture_output=True)
        self.preload = f"{self.shim} {libfaketime()}"

    def _file(self, name: str) -> Path:
        return self.root / f"{name}.offset"

    def env(self, name: str) -> dict[str, str]:
        """The environment that puts process ``name``'s wall clock under its clock file (true to start)."""
        self.set(name, 0)
        return {"LD_PRELOAD": self.preload, "FAKETIME_TIMESTAMP_FILE": str(self._file(name)),
                "FAKETIME_CACHE_DURATION": str(REREAD_SECS), "FAKETIME_DONT_FAKE_MONOTONIC": "1"}

    def set(self, name: str, offset_secs: int) -> None:
        """Process ``name``'s wall clock ``offset_secs`` off the true time from its next re-read on."""
        path = self._file(name)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(f"{offset_secs:+d}\n")
        os.replace(tmp, path)  # a re-read never sees half a file

"""lazyfs.py, the power-loss model, on its own: what was fsynced survives ``lose``, what was not is
gone (a file renamed unsynced survives empty), and a full backing disk fails the fsync, not the write."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from lazyfs import lose

HERE = Path(__file__).resolve().parent


@pytest.fixture
def lazy(tmp_path):
    backing, mount, control = tmp_path / "backing", tmp_path / "mount", tmp_path / "control.sock"
    backing.mkdir()
    mount.mkdir()
    proc = subprocess.Popen([sys.executable, str(HERE / "lazyfs.py"), str(backing), str(mount), str(control)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while not (os.path.ismount(mount) and control.exists()):
        assert proc.poll() is None and time.monotonic() < deadline, "lazyfs did not mount"
        time.sleep(0.05)
    yield mount, backing, str(control)
    subprocess.run(["fusermount3", "-u", "-z", str(mount)], capture_output=True)
    proc.kill()
    proc.wait(10)


def put(directory: Path, name: str, data: bytes, fsync: bool) -> None:
    """The outbox's way: a temporary file, written, (fsynced,) renamed into place."""
    fd = os.open(directory / f".{name}.tmp", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, data)
    if fsync:
        os.fsync(fd)
    os.close(fd)
    os.replace(directory / f".{name}.tmp", directory / name)


def test_what_was_fsynced_survives_a_power_loss_and_what_was_not_is_gone(lazy):
    mount, backing, control = lazy
    put(mount, "kept.json", b'{"verdict": "AC"}', fsync=True)
    put(mount, "unsynced.json", b'{"verdict": "WA"}', fsync=False)
    # Before the loss both read back whole, as from a page cache; only the synced one is on the disk.
    assert (mount / "unsynced.json").read_bytes() == b'{"verdict": "WA"}'
    assert (backing / "kept.json").read_bytes() == b'{"verdict": "AC"}'
    assert lose(control) == 1
    assert sorted(os.listdir(mount)) == ["kept.json", "unsynced.json"]  # metadata is durable
    assert (mount / "kept.json").read_bytes() == b'{"verdict": "AC"}'
    assert (mount / "unsynced.json").read_bytes() == b""  # the zero-length file after a crash


def test_a_full_backing_disk_fails_the_fsync(lazy):
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mount, backing, _ = lazy
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(backing)], check=True)
    try:
        fd = os.open(mount / "big", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, b"x" * (256 * 1024))  # taken into memory
        with pytest.raises(OSError) as failed:
            os.fsync(fd)
        os.close(fd)
        assert failed.value.errno == 28  # ENOSPC
    finally:
        subprocess.run(["umount", "--lazy", str(backing)], capture_output=True)

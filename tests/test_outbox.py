"""The worker's outbox: atomic, durable, ordered; corrupt files are moved aside, never fatal."""

import dataclasses
import errno
import json
import os
import subprocess

import pytest

from worker.backoff import Backoff
from worker.delivery.outbox import Entry, Outbox


def test_put_pending_clear(tmp_path):
    box = Outbox(tmp_path / "outbox")
    first = box.put(Entry("arbiter", 1, "AC", lease_token="t1", lease_gen=1, created_at=1.0))
    box.put(Entry("direct", 2, "WA", created_at=2.0))
    assert oct(first.stat().st_mode & 0o777) == "0o600"
    pending = box.pending()
    assert [e.submission_id for _, e in pending] == [1, 2]
    assert pending[0][1].lease_token == "t1"
    box.clear(pending[0][0])
    assert [e.submission_id for _, e in box.pending()] == [2]


def test_incomplete_write_is_discarded_and_corrupt_file_moved_aside(tmp_path, caplog):
    box = Outbox(tmp_path / "outbox")
    (box.directory / ".000-9-x.json.tmp").write_text('{"half": ')
    (box.directory / "000000000000001-7-bad.json").write_text("{not json")
    (box.directory / "000000000000002-8-odd.json").write_text(json.dumps({"unexpected": 1}))
    good = box.put(Entry("arbiter", 3, "AC", lease_token="t", lease_gen=1))
    pending = box.pending()
    assert [p for p, _ in pending] == [good]
    assert sorted(p.name for p in (box.directory / "corrupt").iterdir()) == [
        "000000000000001-7-bad.json", "000000000000002-8-odd.json"]
    assert not list(box.directory.glob(".*.tmp"))
    assert "corrupt outbox file moved aside" in caplog.text


def test_put_is_durable_against_a_crash_between_write_and_rename(tmp_path, monkeypatch):
    box = Outbox(tmp_path / "outbox")
    calls = []
    real_rename = os.rename

    def crash_on_rename(src, dst):
        calls.append((src, dst))
        raise KeyboardInterrupt("power cut")

    monkeypatch.setattr(os, "rename", crash_on_rename)
    try:
        box.put(Entry("arbiter", 5, "AC", lease_token="t", lease_gen=1))
    except KeyboardInterrupt:
        pass
    monkeypatch.setattr(os, "rename", real_rename)
    assert calls and box.pending() == []  # never half-visible: either absent or whole


def test_backoff_doubles_with_jitter_and_caps_at_30():
    import random

    b = Backoff(1.0, 30.0, rng=random.Random(7))
    delays = [b.next_delay() for _ in range(8)]
    for expected, got in zip([1, 2, 4, 8, 16, 30, 30, 30], delays):
        assert expected * 0.8 <= got <= expected * 1.2
    b.reset()
    assert b.next_delay() <= 1.2


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs")
def test_a_full_disk_refuses_the_write_whole_and_leaves_nothing_half_written(tmp_path):
    """The worker hands the lease back when its result cannot be kept (worker/slot.py): the outbox
    must say so with an OSError, not keep a truncated entry that would be read back as corrupt."""
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], check=True)
    try:
        box = Outbox(disk / "outbox")
        filler = disk / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
        try:
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError:
            pass
        finally:
            os.close(fd)
        with pytest.raises(OSError) as raised:
            box.put(Entry("arbiter", 5, "AC", lease_token="t", lease_gen=1, detail={"out": "x" * 3000}))
        assert raised.value.errno == errno.ENOSPC
        assert list((disk / "outbox").iterdir()) == [] and box.pending() == []
        filler.unlink()
        box.put(Entry("arbiter", 5, "AC", lease_token="t", lease_gen=1, detail={"out": "x" * 3000}))
        assert [e.submission_id for _, e in box.pending()] == [5]
    finally:
        subprocess.run(["umount", "--lazy", str(disk)], check=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs")
def test_a_read_only_disk_keeps_delivered_entries_for_a_later_pass_and_raises_nothing(tmp_path, caplog):
    """Seen in the 2,000-fault chaos run: a result delivered while the outbox's disk was read-only
    could not be removed, and the OSError ended the slot's thread ("Exception in thread slot-0").
    Now clear() says False, the entry is sent again on a later pass (the arbiter answers a repeat
    as the first time), rewrite() (a 413's shrunk entry) says False and keeps the entry as it was, and
    nothing of the outbox raises for a disk that refuses."""
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], check=True)
    try:
        box = Outbox(disk / "outbox")
        delivered = box.put(Entry("arbiter", 5, "AC", lease_token="t", lease_gen=1))
        refused = box.put(Entry("arbiter", 6, "WA", lease_token="u", lease_gen=1))
        (box.directory / ".000-9-x.json.tmp").write_text('{"half": ')
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        assert box.clear(delivered) is False
        # A 413's shrunk entry cannot replace the full one: the full one stays, nothing raises.
        shrunk = dataclasses.replace(box.pending()[1][1], detail={"detail_dropped": "413"})
        assert box.rewrite(refused, shrunk) is False
        assert box.pending()[1][1].detail == {}, "the entry on disk is the one that was there"
        box.reject(refused, "HTTP 422")
        assert [e.submission_id for _, e in box.pending()] == [5, 6], "both kept for the next pass"
        assert "a delivered result stays in the outbox" in caplog.text
        subprocess.run(["mount", "-o", "remount,rw", str(disk)], check=True)
        assert box.clear(delivered) is True
        assert [e.submission_id for _, e in box.pending()] == [6]
        assert not list(box.directory.glob(".*.tmp")), "the incomplete write goes once the disk allows"
    finally:
        subprocess.run(["umount", "--lazy", str(disk)], check=True)

"""Test data as a versioned fact of the database: its digest is set by judgectl, carried by every lease,
checked by the worker before judging (stale data never gives a verdict), recorded in every history
row, and `judgectl rejudge --problem P --data-changed` rejudges exactly what was judged with other data."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import time

from support.procs import aplusb_site, wait_for, write_testdata
from support.programs import APLUSB_TESTS, PROGRAMS

from arbiter.protocol import testdata
from arbiter.store import leases

FAST = {"heartbeat_interval_secs": 1.0, "long_poll_secs": 2.0, "backoff_initial_secs": 0.2, "backoff_max_secs": 1.0}
NEW_TESTS = APLUSB_TESTS + [("100 200\n", "300\n")]


def judgectl(db, *args):
    return subprocess.run([sys.executable, "-m", "arbiter.ctl.main", "--dsn", db.dsn, *args],
                          capture_output=True, text=True, timeout=60)


def test_the_digest_is_of_names_sizes_and_contents_and_is_cached_until_a_file_changes(tmp_path):
    d = write_testdata(tmp_path / "a", 1, APLUSB_TESTS)
    same = write_testdata(tmp_path / "b", 1, APLUSB_TESTS)
    first = testdata.directory_digest(d)
    assert first == testdata.directory_digest(same) and len(first) == 64
    cache = testdata.DigestCache()
    assert cache.digest(d) == first
    (d / "1.out").write_text("4\n")  # same size, other content
    assert cache.digest(d) != first, "a changed file must change the digest"
    (d / "1.out").write_text("3\n")
    assert cache.digest(d) == first
    (d / "1.out").rename(d / "9.out")
    assert cache.digest(d) != first, "a renamed file must change the digest"


def test_judgectl_problem_data_from_a_directory_or_an_archive(db, tmp_path):
    with db.connect() as conn:
        conn.execute("INSERT INTO problems (slug, title) VALUES ('aplusb', 'A+B')")
    d = write_testdata(tmp_path / "td", 1, APLUSB_TESTS)
    first = judgectl(db, "problem", "data", "aplusb", str(d))
    assert first.returncode == 0, first.stderr
    digest = testdata.directory_digest(d)
    assert digest in first.stdout and "was unset" in first.stdout
    again = judgectl(db, "problem", "data", "aplusb", str(d))
    assert "unchanged" in again.stdout
    archive = tmp_path / "td.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(d, arcname="1")
    from_tar = judgectl(db, "problem", "data", "aplusb", str(archive))
    assert from_tar.returncode == 0 and "unchanged" in from_tar.stdout, from_tar.stdout + from_tar.stderr
    for bad, error in ((tmp_path / "none", "no such directory or archive"), (d / "1.in", "not a tar archive")):
        result = judgectl(db, "problem", "data", "aplusb", str(bad))
        assert result.returncode == 2 and error in result.stderr and result.stderr.count("\n") == 1, result.stderr
    (tmp_path / "nothing").mkdir()
    empty = judgectl(db, "problem", "data", "aplusb", str(tmp_path / "nothing"))
    assert empty.returncode == 2 and "no .in files" in empty.stderr
    assert judgectl(db, "problem", "data", "nope", str(d)).returncode == 2
    with db.connect() as conn:
        assert conn.execute("SELECT data_digest FROM problems WHERE slug = 'aplusb'").fetchone() == (digest,)


def withhold(db, digest: str) -> None:
    """The data set's listing is not in the database (its content cannot be fetched from the arbiter,
    as with data recorded elsewhere): a worker can judge only with a copy of its own."""
    with db.connect() as conn:
        conn.execute("DELETE FROM test_data_files WHERE digest = %s", (digest,))


def _history(db):
    with db.connect() as conn:
        return conn.execute("SELECT submission_id, worker_id, verdict, data_digest FROM submission_judgings "
                            "ORDER BY seq").fetchall()


def test_stale_data_never_judges_and_data_changed_rejudges_exactly_what_used_other_data(
        db, arbiters, workers, tmp_path):
    site = aplusb_site(db, tmp_path)
    old_dir = site.testdata / str(site.problem)
    old = testdata.directory_digest(old_dir)
    assert judgectl(db, "problem", "data", "aplusb", str(old_dir)).returncode == 0
    # The stale worker hands the new submission back again and again: enough releases for the test.
    a = arbiters.start(db.dsn, max_releases=100_000)
    stale = workers("home-1", "home", "arbiter", site.testdata, arbiter_urls=[a.url], credential=site.cred,
                    **FAST).start()
    with db.connect() as conn:
        first = [leases.submit(conn, site.user, site.problem, "python3", PROGRAMS["python3"]["AC"]) for _ in range(3)]
        ce = leases.submit(conn, site.user, site.problem, "c", PROGRAMS["c"]["CE"])
    wait_for(lambda: len(_history(db)) == 4, 60, interval=0.2, what="the first submissions judged")
    assert {row[3] for row in _history(db)} == {old}, "every history row records the data it was judged with"

    # The problem's data is fixed: the new data's digest goes into the database; home-1 still has the old.
    new_dir = write_testdata(tmp_path / "new-testdata", site.problem, NEW_TESTS)
    new = testdata.directory_digest(new_dir)
    assert judgectl(db, "problem", "data", "aplusb", str(new_dir)).returncode == 0
    withhold(db, new)
    with db.connect() as conn:
        fresh = leases.submit(conn, site.user, site.problem, "python3", PROGRAMS["python3"]["WA"])
    wait_for(lambda: "cannot judge this submission here" in stale.log_text(), 30, interval=0.2,
             what="the stale worker to refuse the new submission")
    assert all(row[0] != fresh for row in _history(db)), "judged with stale data"

    rejudged = judgectl(db, "rejudge", "--problem", "aplusb", "--data-changed")
    assert rejudged.returncode == 0, rejudged.stderr
    assert sorted(int(line.split()[0]) for line in rejudged.stdout.splitlines()) == first, \
        "exactly the decided submissions judged with the old data (not the compile error, not the pending one)"

    # A worker with the new data judges them all; the stale one judges none.
    current = tmp_path / "current"
    shutil.copytree(site.testdata, current)
    shutil.rmtree(current / str(site.problem))
    shutil.copytree(new_dir, current / str(site.problem))
    workers("home-2", "home", "arbiter", current, arbiter_urls=[a.url], credential=_add(db, "home-2"),
            **FAST).start()
    wait_for(lambda: len(_history(db)) == 4 + 3 + 1, 90, interval=0.2, what="rejudged with the new data")
    after = _history(db)[4:]
    assert {row[1] for row in after} == {"home-2"} and {row[3] for row in after} == {new}
    with db.connect() as conn:
        assert conn.execute("SELECT status FROM submissions WHERE id = %s", (fresh,)).fetchone() == ("WA",)
        assert conn.execute("SELECT status FROM submissions WHERE id = %s", (ce,)).fetchone() == ("CE",)
    nothing = judgectl(db, "rejudge", "--problem", "aplusb", "--data-changed")
    assert nothing.returncode == 0 and "nothing to rejudge" in nothing.stdout
    for bad in (("--data-changed",), ("--problem", "aplusb"), ("--problem", "nope", "--data-changed")):
        assert judgectl(db, "rejudge", *bad).returncode == 2


def _add(db, worker_id):
    from support.procs import add_worker

    with db.connect() as conn:
        return add_worker(conn, worker_id)


def test_a_worker_without_the_right_data_steps_aside_instead_of_using_up_the_releases(db, arbiters, workers,
                                                                                      tmp_path):
    """Default max_releases (5): a stale worker alone must not turn a submission into system_error in a
    blink by taking it back again and again; a worker with the right data, arriving seconds later, judges it."""
    site = aplusb_site(db, tmp_path)
    new_dir = write_testdata(tmp_path / "new", site.problem, NEW_TESTS)
    assert judgectl(db, "problem", "data", "aplusb", str(new_dir)).returncode == 0
    withhold(db, testdata.directory_digest(new_dir))
    a = arbiters.start(db.dsn)
    stale = workers("home-1", "home", "arbiter", site.testdata, arbiter_urls=[a.url], credential=site.cred,
                    **FAST).start()
    with db.connect() as conn:
        sid = leases.submit(conn, site.user, site.problem, "python3", PROGRAMS["python3"]["AC"])

        def releases():
            return conn.execute("SELECT status, lease_releases FROM submissions WHERE id = %s", (sid,)).fetchone()

        wait_for(lambda: releases()[1] >= 1, 30, interval=0.1, what="the stale worker's first hand-back")
        time.sleep(3)  # what the stale worker does meanwhile is the point: it must not ask again and again
        status, count = releases()
        assert status in ("pending", "judging") and count <= 3, (status, count)
        assert "stepping aside" in stale.log_text()
        current = tmp_path / "current"
        shutil.copytree(new_dir, current / str(site.problem))
        workers("home-2", "home", "arbiter", current, arbiter_urls=[a.url], credential=_add(db, "home-2"),
                **FAST).start()
        wait_for(lambda: releases()[0] not in ("pending", "judging"), 60, interval=0.2, what="a verdict")
        assert releases()[0] == "AC"
        assert conn.execute("SELECT worker_id FROM submission_judgings WHERE submission_id = %s",
                            (sid,)).fetchall() == [("home-2",)]

"""Worker credential rotation: the previous secret works for the overlap (DB time) and not after it; a
worker whose credential file is replaced sends the new one with no refused request; revoke ends both."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import threading
import time
import uuid

import pytest
from support.procs import add_worker, aplusb_site, wait_for
from support.programs import PROGRAMS

from arbiter.store import credentials, leases
from worker.credential_file import CredentialError, CredentialFile
from worker.delivery.http_client import ArbiterClient

FAST = {"heartbeat_interval_secs": 0.5, "long_poll_secs": 2.0, "backoff_initial_secs": 0.2,
        "backoff_max_secs": 2.0}
CACHE_SECS = 0.5


def judgectl(db, *args, stdin=None):
    return subprocess.run([sys.executable, "-m", "arbiter.ctl.main", "--dsn", db.dsn, *args],
                          capture_output=True, text=True, timeout=60, input=stdin)


def status_of(arbiter, credential: str) -> int:
    return ArbiterClient([arbiter.url], credential, timeout=10).acquire(uuid.uuid4().hex, None, 0).status


def refused_requests(arbiter) -> float:
    status, text = arbiter.get("/metrics")
    assert status == 200
    return sum(float(v) for v in re.findall(r'^arbiter_requests_total\{[^}]*status="401"[^}]*\} (\S+)$', text, re.M))


def replace_file(path, text: str) -> None:
    """As Ansible's copy does it: a new file renamed over the old one."""
    tmp = path.with_name(path.name + ".new")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")
    os.replace(tmp, path)


def test_rotate_keeps_the_previous_secret_for_the_overlap_only(db, arbiters, tmp_path):
    site = aplusb_site(db, tmp_path)
    a = arbiters.start(db.dsn, credential_cache_secs=CACHE_SECS)
    old = site.cred
    assert status_of(a, old) == 204
    out = tmp_path / "new-credential"
    rotated = judgectl(db, "worker", "rotate", "home-1", "--overlap", "3", "--credential-file", str(out))
    assert rotated.returncode == 0, rotated.stderr
    assert "stays valid until" in rotated.stderr
    new = out.read_text().strip()
    assert oct(out.stat().st_mode & 0o777) == "0o600" and new.startswith("home-1.") and new != old
    assert new not in rotated.stdout + rotated.stderr
    rotated_at = time.monotonic()
    assert status_of(a, new) == 204
    time.sleep(2 * CACHE_SECS)  # what the arbiter had verified before the rotation is forgotten by now
    assert status_of(a, old) == 204, "the previous credential must work during the overlap"
    wait_for(lambda: status_of(a, old) == 401, 3 + CACHE_SECS + 5, interval=0.1, what="the overlap to end")
    assert time.monotonic() - rotated_at > 2.5, "the previous credential was refused before its overlap ended"
    assert status_of(a, new) == 204
    with db.connect() as conn:
        row = conn.execute("SELECT secret_sha256, previous_secret_sha256 FROM workers "
                           "WHERE worker_id = 'home-1'").fetchone()
    assert row[0] == credentials.hash_secret(new.partition(".")[2])
    assert row[1] == credentials.hash_secret(old.partition(".")[2])  # kept, but its time is over

    unknown = judgectl(db, "worker", "rotate", "nobody")
    assert unknown.returncode == 1 and "no worker 'nobody'" in unknown.stderr
    bad = judgectl(db, "worker", "rotate", "home-1", "--overlap", "-1")
    assert bad.returncode == 2 and "--overlap" in bad.stderr
    assert status_of(a, new) == 204, "a refused rotate changed the credential"


def test_revoke_ends_the_current_and_the_previous_secret(db, arbiters, tmp_path):
    site = aplusb_site(db, tmp_path)
    a = arbiters.start(db.dsn, credential_cache_secs=CACHE_SECS)
    rotated = judgectl(db, "worker", "rotate", "home-1", "--overlap", "3600")
    new = rotated.stdout.strip()
    assert status_of(a, site.cred) == 204 and status_of(a, new) == 204
    assert judgectl(db, "worker", "revoke", "home-1").returncode == 0
    wait_for(lambda: status_of(a, site.cred) == 401 and status_of(a, new) == 401, CACHE_SECS + 5, interval=0.1,
             what="the revocation to apply to both secrets")
    # A revoked worker given a new credential gets no overlap for the revoked one.
    again = judgectl(db, "worker", "rotate", "home-1")
    assert again.returncode == 0 and "no longer" in again.stderr
    assert status_of(a, again.stdout.strip()) == 204
    assert status_of(a, new) == 401


LONG_CACHE = 300.0  # the default: a verified credential is used this long while changes are heard


def revoke_behind_judgectls_back(db, worker_id: str) -> None:
    """What no NOTIFY announces: a cached credential stays in use (up to credential_cache_secs)."""
    with db.connect() as conn:
        conn.execute("UPDATE workers SET revoked_at = now() WHERE worker_id = %s", (worker_id,))


def test_a_revocation_by_judgectl_is_heard_at_once_however_long_the_cache(db, arbiters, tmp_path):
    site = aplusb_site(db, tmp_path)
    with db.connect() as conn:
        other = add_worker(conn, "home-2")
    a = arbiters.start(db.dsn, credential_cache_secs=LONG_CACHE)
    assert status_of(a, site.cred) == 204 and status_of(a, other) == 204
    revoke_behind_judgectls_back(db, "home-2")
    time.sleep(1.0)
    assert status_of(a, other) == 204, "the cache is in use: a verified credential is not read again"
    assert judgectl(db, "worker", "revoke", "home-1").returncode == 0
    wait_for(lambda: status_of(a, site.cred) == 401, 3, interval=0.05, what="judgectl's revocation to be heard")
    # A changed profile is heard too: the worker's languages are read again.
    again = judgectl(db, "worker", "rotate", "home-1")
    fresh = again.stdout.strip()
    assert status_of(a, fresh) == 204
    ensured = judgectl(db, "worker", "ensure", "home-1", "--kind", "home", "--languages", "c",
                       "--credential-file", "-", stdin=fresh)
    assert ensured.returncode == 0 and "kind/languages/slots set" in ensured.stdout, ensured.stdout
    client = ArbiterClient([a.url], fresh, timeout=10)
    with db.connect() as conn:
        leases.submit(conn, site.user, site.problem, "python3", PROGRAMS["python3"]["AC"])
    assert client.acquire(uuid.uuid4().hex, None, 0).status == 204, "home-1 judges only c now: no python3 for it"


def watch_sessions(db) -> list[int]:
    with db.connect() as conn:
        return [pid for (pid,) in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE query LIKE 'LISTEN worker_credentials%' "
            "OR query LIKE '%UPDATE workers SET last_seen_at = now() WHERE worker_id = ANY%'").fetchall()]


def test_a_lost_listening_session_drops_what_was_cached(db, arbiters, tmp_path):
    """Changes made while nobody listened are unknown: the cache starts empty with the new session."""
    site = aplusb_site(db, tmp_path)
    a = arbiters.start(db.dsn, credential_cache_secs=LONG_CACHE)
    assert status_of(a, site.cred) == 204
    revoke_behind_judgectls_back(db, "home-1")
    assert status_of(a, site.cred) == 204, "cached"
    pids = wait_for(lambda: watch_sessions(db), 5, what="the arbiter's listening session")
    with db.connect() as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (pids,))
    wait_for(lambda: status_of(a, site.cred) == 401, 10, interval=0.1, what="the cache to be dropped")
    wait_for(lambda: set(watch_sessions(db)) - set(pids), 10, what="a new listening session")
    until = time.monotonic() + 2.0  # the new session's LISTEN is seen a moment before it is heard
    while time.monotonic() < until:
        assert status_of(a, site.cred) == 401, "what was cached before the session was lost came back"
        time.sleep(0.1)


def test_a_worker_seen_through_the_cache_is_marked_seen(db, arbiters, tmp_path):
    site = aplusb_site(db, tmp_path)
    a = arbiters.start(db.dsn, credential_cache_secs=LONG_CACHE)

    def last_seen():
        with db.connect() as conn:
            return conn.execute("SELECT last_seen_at FROM workers WHERE worker_id = 'home-1'").fetchone()[0]

    assert status_of(a, site.cred) == 204
    first = last_seen()
    assert first is not None, "verified: seen at once"
    time.sleep(1.5)
    assert status_of(a, site.cred) == 204  # from the cache
    wait_for(lambda: last_seen() > first, 10, interval=0.2, what="last_seen_at written for a cached credential")


def test_worker_ensure_with_a_new_credential_is_a_rotation(db, tmp_path):
    site = aplusb_site(db, tmp_path)
    new = credentials.format_credential("home-1", credentials.new_secret())
    result = judgectl(db, "worker", "ensure", "home-1", "--kind", "home", "--credential-file", "-",
                      "--overlap", "60", stdin=new)
    assert result.returncode == 0 and result.stdout.startswith("updated worker home-1: credential rotated")
    with db.connect() as conn:
        row = conn.execute("SELECT secret_sha256, previous_secret_sha256, "
                           "round(extract(epoch FROM previous_secret_until - now())) FROM workers").fetchone()
    assert row[0] == credentials.hash_secret(new.partition(".")[2])
    assert row[1] == credentials.hash_secret(site.cred.partition(".")[2]) and 55 <= row[2] <= 60
    same = judgectl(db, "worker", "ensure", "home-1", "--kind", "home", "--credential-file", "-", stdin=new)
    assert same.stdout.strip() == "unchanged worker home-1"


def test_rotation_under_load_refuses_no_request(db, arbiters, workers, tmp_path):
    """judgectl rotates, then the worker's credential file is replaced (what the worker role does): the
    worker keeps judging, the arbiter refuses none of its requests, and after the overlap (when the old
    secret is refused) it still judges: it sends the new credential."""
    site = aplusb_site(db, tmp_path)
    a = arbiters.start(db.dsn, credential_cache_secs=CACHE_SECS)
    w = workers("home-1", "home", "arbiter", site.testdata, arbiter_urls=[a.url], credential=site.cred, **FAST).start()
    stop = threading.Event()
    submitted: list[int] = []

    def submit_steadily():
        with db.connect() as conn:
            while not stop.is_set():
                submitted.append(leases.submit(conn, site.user, site.problem, "python3", PROGRAMS["python3"]["AC"]))
                stop.wait(0.15)

    def judged() -> int:
        with db.connect() as conn:
            return conn.execute("SELECT count(*) FROM submissions WHERE status = 'AC'").fetchone()[0]

    submitter = threading.Thread(target=submit_steadily)
    submitter.start()
    try:
        wait_for(lambda: judged() >= 5, 60, interval=0.2, what="judging under way")
        new = credentials.format_credential("home-1", credentials.new_secret())
        ensured = judgectl(db, "worker", "ensure", "home-1", "--kind", "home", "--credential-file", "-",
                           "--overlap", "4", stdin=new)
        assert ensured.returncode == 0 and "credential rotated" in ensured.stdout
        # The roll-out takes a while: the worker judges on with the previous secret, past the arbiter's cache.
        rotated_at, before = time.monotonic(), judged()
        wait_for(lambda: judged() >= before + 3 and time.monotonic() - rotated_at > 3 * CACHE_SECS, 60,
                 interval=0.1, what="judging with the previous secret")
        replace_file(w.home / "credential", new)
        wait_for(lambda: status_of(a, site.cred) == 401, 4 + CACHE_SECS + 5, interval=0.2, what="the old secret refused")
        after_overlap = judged()
        refused_before_probe = refused_requests(a) - 1  # the probe that saw 401 just now
        wait_for(lambda: judged() >= after_overlap + 5, 60, interval=0.2, what="judging after the overlap")
    finally:
        stop.set()
        submitter.join()
    wait_for(lambda: judged() == len(submitted), 60, interval=0.2, what="every submission judged")
    assert refused_before_probe == 0, f"{refused_before_probe:g} worker request(s) refused during the rotation"
    assert refused_requests(a) - 1 == 0, "the worker sent the old credential after the overlap"
    assert "credential file replaced" in w.log_text()
    assert new.partition(".")[2] not in w.log_text() + a.log_text()
    assert site.cred.partition(".")[2] not in w.log_text() + a.log_text()


def test_a_botched_credential_file_keeps_the_credential_in_use(tmp_path, caplog):
    path = tmp_path / "credential"
    replace_file(path, "home-1.first")
    source = CredentialFile(path, "home-1")
    assert source.current() == "home-1.first"
    with caplog.at_level(logging.ERROR, logger="judge.worker"):
        replace_file(path, "home-2.someone-else")
        assert source.current() == "home-1.first"
        assert source.current() == "home-1.first"
        path.chmod(0o644)
        assert source.current() == "home-1.first"
    refusals = [r for r in caplog.records if "not usable" in r.getMessage()]
    assert len(refusals) == 2, "one error per bad replacement, not one per request"
    assert "someone-else" not in caplog.text
    replace_file(path, "home-1.second")
    assert source.current() == "home-1.second"
    path.unlink()
    assert source.current() == "home-1.second", "a missing file keeps the credential in use"
    with pytest.raises(CredentialError):
        replace_file(path, "home-9.x")
        CredentialFile(path, "home-1")

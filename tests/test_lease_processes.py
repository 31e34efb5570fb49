"""Lease traffic on more than one process (arbiter/server/roles.py), against a real gunicorn and a real
database: one dispatching process on ``bind`` and lease processes on ``lease_bind``; the grant names
the lease port; the dispatch rules hold however the workers' traffic is spread; a serving process
killed with SIGKILL loses no lease and no result; a reload keeps exactly one dispatching process;
the lease processes' counters reach /metrics."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import urllib.error
import urllib.request
import uuid

import pytest
from support.fixtures_data import seed_problem, seed_submissions
from support.procs import add_worker, request_bytes, wait_for

from arbiter.lab.devcluster import free_port
from worker.delivery.assignment import Assignment
from worker.delivery.http_client import ArbiterClient
from worker.delivery.transport_arbiter import Heartbeats, job_from_lease


@pytest.fixture
def site(db):
    with db.connect() as conn:
        seed_problem(conn)
    return db


def start_with_lease_processes(arbiters, db, lease_processes: int = 2, **settings):
    port = free_port()
    a = arbiters.start(db.dsn, lease_bind=f"127.0.0.1:{port}", lease_processes=lease_processes, **settings)
    a.lease_port = port
    a.lease_url = f"http://127.0.0.1:{port}"
    wait_for(lambda: len(roles_of(a)) == 1 + lease_processes, 20, what="every serving process")
    # A lease process serves once it knows the database answers: its first answer is ready, never a
    # 503 that would send the workers' lease traffic elsewhere for a while.
    status, body = get_json(a.lease_url + "/readyz")
    assert status == 200 and body["role"] == "lease", (status, body)
    return a


def get_json(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def roles_of(arbiter) -> dict[int, str]:
    """pid -> role of the arbiter's serving processes: the one that answers on bind dispatches."""
    status, body = arbiter.get("/readyz")
    dispatching = body.get("pid") if isinstance(body, dict) else None
    return {pid: "dispatch" if pid == dispatching else "lease" for pid in arbiter.worker_pids()}


def process_of(pid_roles: dict[int, str], role: str) -> list[int]:
    return [pid for pid, r in pid_roles.items() if r == role]


def test_the_grant_names_the_lease_port_and_the_lease_processes_serve_lease_traffic(site, arbiters):
    a = start_with_lease_processes(arbiters, site)
    pid_roles = roles_of(a)
    assert sorted(pid_roles.values()) == ["dispatch", "lease", "lease"]
    with site.connect() as conn:
        cred = add_worker(conn, "home-1")
        (sid,) = seed_submissions(conn, 1)
    main = ArbiterClient([a.url], cred)
    lease = main.acquire(uuid.uuid4().hex, None, 5).body
    assert lease["submission_id"] == sid and lease["lease_port"] == a.lease_port
    on_lease_port = ArbiterClient([a.lease_url], cred)
    assert on_lease_port.heartbeat(sid, lease["lease_token"]).status == 200
    # The lease port has no parking lot: an acquire there is refused, and says where it belongs.
    refused = on_lease_port.acquire(uuid.uuid4().hex, None, 0)
    assert refused.status == 404 and "acquire at the arbiter URL" in refused.body["description"], refused
    reply = on_lease_port.result(sid, {"lease_token": lease["lease_token"], "verdict": "AC", "time_ms": 5})
    assert reply.status == 200, reply
    with site.connect() as conn:
        assert conn.execute("SELECT status FROM submissions WHERE id = %s", (sid,)).fetchone()[0] == "AC"
    # The lease processes' counts are in the one /metrics (each publishes within a second).
    wait_for(lambda: a.metric("arbiter_heartbeats_total") == 1 and a.metric("arbiter_results_total") == 1, 5,
             what="the lease processes' counters on /metrics")
    assert a.get("/readyz")[0] == 200


def judged(db) -> tuple[int, int]:
    """(submissions with a verdict, of which judged by a later lease than their first)."""
    with db.connect() as conn:
        return conn.execute("SELECT count(*) FILTER (WHERE status NOT IN ('pending', 'judging')), "
                            "count(*) FILTER (WHERE lease_gen > 1) FROM submissions").fetchone()


@pytest.mark.parametrize("victim", ["lease", "dispatch"])
def test_a_serving_process_killed_with_sigkill_loses_no_lease_and_no_result(site, arbiters, victim):
    """Six workers judging 120 submissions, 0.1 s each, with their lease traffic on the lease port; one
    serving process is killed with SIGKILL twice while results and acquires are in flight. gunicorn
    starts another in its role; every submission is judged by its first lease (none reclaimed,
    none judged twice) and every result is answered 200."""
    from support.simworker import SimWorker

    a = start_with_lease_processes(arbiters, site, lease_processes=1, unconfirmed_secs=10.0, lease_secs=10.0,
                                   grace_secs=10.0)
    with site.connect() as conn:
        creds = [add_worker(conn, f"home-{i}") for i in range(6)]
        seed_submissions(conn, 120)
    workers = [SimWorker([a.url], cred, judge_secs=0.1, wait_secs=2.0) for cred in creds]
    for w in workers:
        w.start()
    try:
        for round_ in (1, 2):
            wait_for(lambda: judged(site)[0] >= 40 * round_, 60, what=f"{40 * round_} judged")
            (pid,) = process_of(roles_of(a), victim)
            subprocess.run(["kill", "-9", str(pid)], check=True)
            wait_for(lambda: pid not in a.worker_pids() and len(roles_of(a)) == 2
                     and victim in roles_of(a).values(), 20, what=f"a new {victim} process")
        wait_for(lambda: judged(site)[0] == 120, 60, what="every submission judged")
    finally:
        for w in workers:
            w.stop()
    assert judged(site) == (120, 0)
    assert sum(len(w.delivered) for w in workers) == 120 and not any(w.refused for w in workers)
    assert all(w.client._lease_urls for w in workers), "the workers' lease traffic went to the lease port"


def test_home_first_holds_with_lease_processes(site, arbiters):
    """The dispatch rules live in the one dispatching process, whichever process carries the workers'
    other traffic: a production worker parked first and a home worker parked after it, one
    submission: the home worker gets it; the production worker gets the next."""
    a = start_with_lease_processes(arbiters, site)
    with site.connect() as conn:
        prod = add_worker(conn, "prod-1", kind="production")
        home = add_worker(conn, "home-1")
    got: dict[str, dict] = {}

    def park(name: str, cred: str) -> None:
        reply = ArbiterClient([a.url], cred).acquire(uuid.uuid4().hex, None, 5)
        if reply.status == 200:
            got[name] = reply.body

    first = threading.Thread(target=park, args=("prod", prod))
    first.start()
    wait_for(lambda: a.get("/readyz")[1]["parked"] == 1, 5, what="the production worker parked")
    second = threading.Thread(target=park, args=("home", home))
    second.start()
    wait_for(lambda: a.get("/readyz")[1]["parked"] == 2, 5, what="the home worker parked")
    with site.connect() as conn:
        (sid,) = seed_submissions(conn, 1)
    second.join(10)
    assert got.get("home", {}).get("submission_id") == sid and "prod" not in got
    # Its lease traffic on a lease process; the production worker, still parked, gets the next one.
    reply = ArbiterClient([a.lease_url], home).result(sid, {"lease_token": got["home"]["lease_token"],
                                                            "verdict": "AC"})
    assert reply.status == 200
    with site.connect() as conn:
        (nxt,) = seed_submissions(conn, 1)
    first.join(10)
    assert got["prod"]["submission_id"] == nxt


def test_a_reload_keeps_one_dispatching_process(site, arbiters):
    """SIGHUP (systemctl reload) replaces every process: the new ones are one dispatching process and
    the lease processes, as at start (the first new one dispatches though the old one still ran)."""
    a = start_with_lease_processes(arbiters, site)
    before = set(a.worker_pids())
    a.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: not before & set(a.worker_pids()) and len(a.worker_pids()) == 3, 30,
             what="the processes replaced")
    a.wait_ready()
    assert sorted(roles_of(a).values()) == ["dispatch", "lease", "lease"]
    # And the replaced dispatching process serves: a grant, with the lease port.
    with site.connect() as conn:
        cred = add_worker(conn, "home-1")
        (sid,) = seed_submissions(conn, 1)
    lease = ArbiterClient([a.url], cred).acquire(uuid.uuid4().hex, None, 5).body
    assert lease["submission_id"] == sid and lease["lease_port"] == a.lease_port
    assert ArbiterClient([a.lease_url], cred).heartbeat(sid, lease["lease_token"]).status == 200


def test_a_worker_whose_lease_port_does_not_answer_uses_its_arbiter_url(site, arbiters):
    """A grant names a lease port the worker cannot reach (a firewall, a lease process gone): the
    heartbeat and the result go to the arbiter URL, which serves the same routes, and the lease URL
    is passed over from then on, not tried once per request."""
    a = arbiters.start(site.dsn)  # one process: no lease port of its own
    with site.connect() as conn:
        cred = add_worker(conn, "home-1")
        (sid,) = seed_submissions(conn, 1)
    client = ArbiterClient([a.url], cred, timeout=5)
    lease = client.acquire(uuid.uuid4().hex, None, 5).body
    assert "lease_port" not in lease  # without lease_bind, no port is named
    client.learn_lease_port(free_port())  # as a grant naming a port nothing listens on would
    (unreachable,) = client._lease_urls.values()
    assert client._order(lease_traffic=True)[0] == unreachable
    assert client.heartbeat(sid, lease["lease_token"]).status == 200
    assert client._order(lease_traffic=True) == [a.url]
    assert client.result(sid, {"lease_token": lease["lease_token"], "verdict": "AC"}).status == 200


def exited(pid: int) -> bool:
    """The process is gone or a zombie (its descriptors closed, its parent not yet told)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.parametrize("busy", ["dispatch", "lease"])
def test_a_stopping_arbiter_leaves_no_port_that_accepts_and_never_answers(site, arbiters, busy):
    """An arbiter stops (SIGTERM to its process group, as supervisor stops it) while one of its serving
    processes still finishes a request in flight (its body still arriving) and the other has exited.
    A new connection to the exited process's port is refused or answered at once, so that a worker
    goes to its next URL: never taken into a listening socket's backlog that no process serves any
    more, where a heartbeat waits out the worker's request timeout (longer than a lease: a lease
    lost to a rolling upgrade). Each serving process holds only the listening sockets it serves."""
    a = start_with_lease_processes(arbiters, site, lease_processes=1, body_timeout_secs=10.0)
    with site.connect() as conn:
        cred = add_worker(conn, "home-1")
    pid_roles = roles_of(a)
    idle = "lease" if busy == "dispatch" else "dispatch"
    (busy_pid,), (idle_pid,) = process_of(pid_roles, busy), process_of(pid_roles, idle)
    port_of = {"dispatch": a.port, "lease": a.lease_port}
    in_flight = socket.create_connection(("127.0.0.1", port_of[busy]), timeout=5)
    try:
        head = request_bytes("/v1/leases/1/heartbeat", {"lease_token": "x" * 40}, cred)
        in_flight.sendall(head[:-10])  # all but the last bytes of the body: the request is in flight
        a.signal_all(signal.SIGTERM)
        wait_for(lambda: exited(idle_pid), 10, what=f"the {idle} process to exit")
        assert not exited(busy_pid), f"the {busy} process exited: nothing held the stop"
        try:
            probe = socket.create_connection(("127.0.0.1", port_of[idle]), timeout=3)
        except ConnectionRefusedError:
            pass
        else:
            with probe:
                probe.sendall(b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n")
                try:
                    answer = probe.recv(100)
                except ConnectionResetError:
                    answer = b""
                except TimeoutError:
                    pytest.fail(f"a connection to the {idle} port of a stopping arbiter was accepted and "
                                f"not answered for 3 s (the {busy} process still holds its listening socket)")
                assert answer == b"" or answer.startswith(b"HTTP/1.1 "), answer
        assert not exited(busy_pid), f"the {busy} process exited during the probe: the probe proved nothing"
    finally:
        in_flight.close()
    a.proc.wait(20)
    assert os.path.exists(a.log_path)


def test_a_heartbeat_waits_at_a_url_that_never_answers_no_longer_than_its_interval(site, arbiters):
    """The first URL a heartbeat tries takes the connection and never answers (a listening socket no
    process serves yet: an arbiter host's port while its process starts). The worker's request timeout
    (10 s) is longer than the lease's first term (2 s here, 4 s in the lab), as in the lab: the
    heartbeat moves to the next URL after its interval (1 s), and the lease is confirmed, not lost."""
    a = arbiters.start(site.dsn)  # tests/support/procs.py FAST: unconfirmed 2 s, lease 4 s
    with socket.socket() as silent, site.connect() as conn:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # the kernel completes connections; nothing ever accepts them
        cred = add_worker(conn, "home-1")
        (sid,) = seed_submissions(conn, 1)
        lease = ArbiterClient([a.url], cred).acquire(uuid.uuid4().hex, None, 5).body
        client = ArbiterClient([f"http://127.0.0.1:{silent.getsockname()[1]}", a.url], cred, timeout=10.0)
        beats = Heartbeats(client, Assignment(job_from_lease(lease), lease["lease_token"], lease["lease_gen"],
                                              "arbiter"), interval=1.0, backoff_max=1.0)
        assert beats.beat(), "no URL answered the heartbeat"
        assert not beats.lost.is_set(), "the lease was lost while the heartbeat waited at the silent URL"
        row = conn.execute("SELECT status, lease_gen, lease_confirmed_at IS NOT NULL FROM submissions "
                           "WHERE id = %s", (sid,)).fetchone()
    assert row == ("judging", lease["lease_gen"], True), row

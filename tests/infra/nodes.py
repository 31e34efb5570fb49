"""testinfra checks of what a cutover stage leaves on each lab node (services, sockets, configs, modes).

Each function takes testinfra hosts (``ssh://`` with the lab's ssh config) and asserts; all of them
can fail, and the cutover test runs them after every stage and every rollback.
"""

from __future__ import annotations

import json
import shlex

SUPERVISORCTL = "/opt/judge-arbiter/venv/bin/supervisorctl --configuration /etc/{name}/supervisord.conf"
HOME, PRODUCTION = ("home-1", "home-2"), ("prod-1",)


def expected_transport(worker: str, stage: int) -> str:
    if stage < 2:
        return "direct"
    if stage == 2:
        return "arbiter" if worker == "home-1" else "direct"
    if stage == 3:
        return "arbiter" if worker in HOME else "direct"
    return "arbiter"


def has_db_account(worker: str, stage: int) -> bool:
    return stage <= (2 if worker in HOME else 3)


DATABASES = {"db-1": "10.231.0.10", "db-2": "10.231.0.11"}
ETCD = {"db-1": "10.231.0.10", "db-2": "10.231.0.11", "arbiter-1": "10.231.0.20"}
PRIMARY_ROLES = ("leader", "master", "primary")


def check_db_node(db) -> None:
    assert db.socket("tcp://10.231.0.10:5432").is_listening
    assert not db.socket("tcp://0.0.0.0:8080").is_listening


def check_database(nodes: dict, ha: bool) -> str:
    """The database as its hosts run it; returns the primary's host. Alone: db-1's server. Replicated
    (db_ha.yml): both hosts run PostgreSQL under Patroni, one primary and one synchronous standby
    streaming from it (PostgreSQL's own pg_stat_replication, read on the primary), and the three
    etcd members answer healthy."""
    if not ha:
        check_db_node(nodes["db-1"])
        return "db-1"
    for name, address in DATABASES.items():
        assert nodes[name].socket(f"tcp://{address}:5432").is_listening, name
        status = nodes[name].run(SUPERVISORCTL.format(name="judge-patroni") + " status judge-patroni")
        assert "RUNNING" in status.stdout, (name, status.stdout)
    members = _patroni(nodes["db-1"], "http://10.231.0.10:8008/cluster")["members"]
    primaries = [m["name"] for m in members if m["role"] in PRIMARY_ROLES and m["state"] == "running"]
    assert len(primaries) == 1, members
    primary = primaries[0]
    standby = next(name for name in DATABASES if name != primary)
    assert [m["role"] for m in members if m["name"] == standby] == ["sync_standby"], members
    streams = _patroni(nodes[primary], f"http://{DATABASES[primary]}:8008/patroni").get("replication", [])
    assert [(s["application_name"], s["state"], s["sync_state"]) for s in streams] == \
        [(standby, "streaming", "sync")], streams
    endpoints = ",".join(f"http://{address}:2379" for address in ETCD.values())
    health = nodes["db-1"].run(f"ETCDCTL_API=3 etcdctl --endpoints={endpoints} endpoint health")
    said = health.stdout + health.stderr  # etcdctl writes its verdicts to stderr
    assert health.rc == 0 and said.count("is healthy") == 3, said
    for name in ETCD:
        status = nodes[name].run(SUPERVISORCTL.format(name="judge-etcd") + " status judge-etcd")
        assert "RUNNING" in status.stdout, (name, status.stdout)
    return primary


def _patroni(node, url: str) -> dict:
    """What Patroni's REST API says, read on the host itself."""
    reply = node.run("/usr/bin/python3 -c " + shlex.quote(
        f"import urllib.request; print(urllib.request.urlopen({url!r}, timeout=5).read().decode())"))
    assert reply.rc == 0, reply.stderr
    return json.loads(reply.stdout)


ARBITERS = ("arbiter-1", "arbiter-2")


def check_arbiter_node(arbiter, stage: int) -> bool | None:
    """Returns whether this arbiter leads (None below stage 2: none runs)."""
    listening = arbiter.socket("tcp://0.0.0.0:8080").is_listening
    if stage < 2:
        assert not listening, "below stage 2 no arbiter may run"
        assert not arbiter.file("/etc/judge-arbiter/programs/judge-arbiter.conf").exists
        return None
    assert listening
    # The lease port (the role's default): lease processes beside the dispatching one.
    assert arbiter.socket("tcp://0.0.0.0:8081").is_listening
    status = arbiter.run(SUPERVISORCTL.format(name="judge-arbiter") + " status judge-arbiter")
    assert "RUNNING" in status.stdout, status.stdout
    assert arbiter.process.filter(user="judge-arbiter", comm="judge-arbiter") or \
        any("gunicorn" in p.args for p in arbiter.process.filter(user="judge-arbiter")), "runs as judge-arbiter"
    dsn = arbiter.file("/etc/judge-arbiter/dsn")
    assert dsn.mode == 0o600 and dsn.user == "judge-arbiter"
    conf = arbiter.file("/etc/judge-arbiter/arbiter.toml")
    assert conf.mode == 0o640 and "password=" not in conf.content_string, "the password lives in dsn only"
    # HTTPS only, with a certificate of the site's CA whose key is the arbiter's alone.
    assert 'tls_certfile = "/etc/judge-arbiter/tls/server.crt"' in conf.content_string
    key = arbiter.file("/etc/judge-arbiter/tls/server.key")
    assert key.mode == 0o600 and key.user == "judge-arbiter"
    # Ready and leading (200), or standing by (503: the database answers, another arbiter leads).
    ready = readiness(arbiter)
    assert ready in ([LEADING, "no plaintext"], [STANDING_BY, "no plaintext"]), ready
    # The lab sets an operator token: /metrics answers only to it, even on loopback. The check reads
    # the token on the host itself, so it never crosses a command line.
    token = arbiter.file("/etc/judge-arbiter/operator-token")
    assert token.mode == 0o600 and token.user == "judge-arbiter"
    assert "operator_token_file" in conf.content_string
    metrics = arbiter.run("/usr/bin/python3 -c " + shlex.quote(
        "import ssl, urllib.request, urllib.error\n"
        "ctx = ssl.create_default_context(cafile='/etc/judge-arbiter/tls/ca.crt')\n"
        "token = open('/etc/judge-arbiter/operator-token').read().strip()\n"
        "for headers in ({}, {'Authorization': 'Bearer ' + token}):\n"
        "    try:\n"
        "        r = urllib.request.urlopen(urllib.request.Request('https://127.0.0.1:8080/metrics', headers=headers),"
        " timeout=5, context=ctx)\n"
        "        print(r.status)\n"
        "    except urllib.error.HTTPError as e:\n"
        "        print(e.code)\n"))
    assert metrics.stdout.split() == ["401", "200"], metrics.stdout + metrics.stderr
    return ready[0] == LEADING


# The first line of readiness() for an arbiter that leads, and for one that stands by (the database
# answers it, another arbiter holds the lock).
LEADING = "200 leader db_up"
STANDING_BY = "503 standby db_up"


def readiness(arbiter) -> list[str]:
    """What the arbiter's /readyz says on its host, as lines: "<status> leader|standby db_up|db_down"
    (or "down: <error>" when nothing answers), then whether plain HTTP answered too."""
    probe = arbiter.run("/usr/bin/python3 -c " + shlex.quote(
        "import json, ssl, urllib.request, urllib.error\n"
        "ctx = ssl.create_default_context(cafile='/etc/judge-arbiter/tls/ca.crt')\n"
        "try:\n"
        "    try:\n"
        "        r = urllib.request.urlopen('https://127.0.0.1:8080/readyz', timeout=5, context=ctx)\n"
        "    except urllib.error.HTTPError as e:\n"
        "        r = e\n"
        "    body = json.loads(r.read())\n"
        "    print(r.status, 'leader' if body['leader'] else 'standby', 'db_up' if body['db_up'] else 'db_down')\n"
        "except (OSError, ValueError) as e:\n"
        "    print('down:', type(e).__name__)\n"
        "try:\n"
        "    urllib.request.urlopen('http://127.0.0.1:8080/readyz', timeout=5)\n"
        "    print('plaintext answered')\n"
        "except Exception:\n"
        "    print('no plaintext')\n"))
    assert probe.rc == 0, probe.stderr
    return probe.stdout.splitlines()


def leader_among(nodes: dict) -> str | None:
    """The one arbiter whose /readyz says it leads with the database up, or None (none, or several)."""
    leading = [name for name in ARBITERS if readiness(nodes[name])[0] == LEADING]
    return leading[0] if len(leading) == 1 else None


def check_arbiters(nodes: dict, stage: int) -> str | None:
    """Every arbiter host passes its checks and, from stage 2 on, exactly one leads; returns it."""
    leaders = [name for name in ARBITERS if check_arbiter_node(nodes[name], stage)]
    if stage < 2:
        return None
    assert len(leaders) == 1, f"arbiters leading: {leaders} (exactly one must)"
    return leaders[0]


def check_worker_node(node, worker: str, stage: int) -> None:
    transport = expected_transport(worker, stage)
    config = node.file("/etc/judge-worker/worker.toml")
    assert config.mode == 0o640
    assert f'transport = "{transport}"' in config.content_string
    status = node.run(SUPERVISORCTL.format(name="judge-worker") + " status judge-worker")
    assert "RUNNING" in status.stdout, status.stdout
    credential, dsn = node.file("/etc/judge-worker/credential"), node.file("/etc/judge-worker/dsn")
    if stage >= 2:
        assert credential.exists and credential.mode == 0o600 and credential.user == "root"
        assert node.file("/etc/judge-worker/ca.crt").exists
        if transport == "arbiter":
            assert 'arbiter_urls = ["https://' in config.content_string
            assert 'tls_ca_file = "/etc/judge-worker/ca.crt"' in config.content_string
    else:
        assert not credential.exists
    if has_db_account(worker, stage):
        assert dsn.exists and dsn.mode == 0o600 and dsn.user == "root"
    else:
        assert not dsn.exists, "the legacy DB credentials leave with the account"
    assert node.file("/etc/judge-worker").mode == 0o750


LOGIN = ("import sys, psycopg\n"
         "try:\n"
         "    psycopg.connect(sys.argv[1], connect_timeout=5).close()\n"
         "except psycopg.OperationalError as e:\n"
         "    print(str(e).strip().splitlines()[-1]); sys.exit(3)\n"
         "print('logged in')\n")


def legacy_login(node, worker: str, password: str):
    """Try the worker's legacy DB account from its own host, with the password it had."""
    role = f"judge_worker_{worker.replace('-', '_')}"
    dsn = f"host=10.231.0.10 port=5432 dbname=judge user={role} password={password}"
    return node.run("/opt/judge-arbiter/venv/bin/python -c " + shlex.quote(LOGIN) + " " + shlex.quote(dsn))


def check_legacy_login(node, worker: str, password: str, stage: int) -> None:
    result = legacy_login(node, worker, password)
    if has_db_account(worker, stage):
        assert result.rc == 0 and "logged in" in result.stdout, result.stdout + result.stderr
    else:
        assert result.rc == 3, f"{worker} can still log in to the database at stage {stage}"
        assert "password authentication failed" in result.stdout, result.stdout


def check_all(nodes: dict, passwords: dict, stage: int, db_ha: bool = False) -> None:
    # One host after another: testinfra imports its modules on first use, and imports in several
    # threads at once under pytest's assertion rewriting broke CPython 3.11's compiler once
    # ("SystemError: AST constructor recursion depth mismatch").
    check_database(nodes, db_ha)
    check_arbiters(nodes, stage)
    for worker in HOME + PRODUCTION:
        check_worker_node(nodes[worker], worker, stage)
        check_legacy_login(nodes[worker], worker, passwords[worker], stage)

"""The four-stage cutover and its rollback, by the Ansible playbooks, on the multi-host lab.

ansible/lab/netlab.py brings up seven hosts (network + mount namespaces, each with its own sshd):
db-1 with a real PostgreSQL holding a legacy site, an empty db-2, two arbiter hosts, three workers.
First db_ha.yml replicates the legacy site's database onto db-2 (Patroni, etcd); then the
documented procedure on the idle lab, nobody submitting (every worker switch is proven by its
gate's canary alone); then the whole cutover again with submissions arriving the whole time, run
exactly as an operator runs it: a --check --diff preview, the stage, the stage again (which must
change nothing); after each stage and each rollback step testinfra checks every node and the
database shows nothing lost, stuck or judged wrong. At stage 4 the database's primary host and
then the leading arbiter are killed under the flow.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
import pytest
from infra import nodes as node_checks
from support.procs import wait_for

if TYPE_CHECKING:
    from arbiter.store import canary

REPO = Path(__file__).resolve().parents[2]
ANSIBLE = REPO / "ansible"
BIN = Path(sys.executable).parent

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(3600),
    pytest.mark.skipif(os.geteuid() != 0, reason="the lab needs root (namespaces, mounts)"),
    pytest.mark.skipif(shutil.which("sshd", path="/usr/sbin:/usr/bin") is None, reason="openssh-server missing"),
    pytest.mark.skipif(not (BIN / "ansible-playbook").exists(), reason="ansible-core missing"),
]

POLL_SECS = 0.2  # how often the checks below look at the database again
FLOW_SECS = 1.0  # one submission per this many seconds, the whole time

AC = "a, b = map(int, input().split())\nprint(a + b)\n"
WA = "a, b = map(int, input().split())\nprint(a * b)\n"


class Lab:
    def __init__(self, base: Path):
        self.base = base
        self.info = json.loads((base / "lab.json").read_text())
        self.secrets = {}
        for line in (base / "secrets.yml").read_text().splitlines():
            key, sep, value = line.partition(": ")
            if sep and not line.startswith("#"):
                self.secrets[key] = json.loads(value)
        self.logs: list[Path] = []
        self.output = ""  # the last play's output
        self.stage: int | None = None  # where the last successful stage play or rollback left the lab
        # Once db_ha.yml has run: the operator has set judge_db_ha in the inventory (every play gets
        # it), and the database is reached over TCP at whichever host is primary.
        self.db_ha = False

    def admin_dsn(self) -> str:
        if not self.db_ha:
            return self.info["admin_dsn"]
        hosts = ",".join(lab_address(h) for h in DB_HOSTS)
        return (f"host={hosts} port=5432 dbname=judge user=postgres target_session_attrs=read-write "
                f"password={self.secrets['judge_db_superuser_password']} connect_timeout=3")

    def connect(self) -> psycopg.Connection:
        return psycopg.connect(self.admin_dsn(), autocommit=True)

    def play(self, playbook: str, *extra: str, check: bool = False) -> dict[str, dict[str, int]]:
        """Run a playbook like an operator; return the recap {host: {ok, changed, failed, ...}}."""
        argv = [str(BIN / "ansible-playbook"), "-i", "inventories/lab", playbook, "-e", f"@{self.base}/secrets.yml",
                *(HA if self.db_ha else ()), *extra]
        if check:
            argv += ["--check", "--diff"]
        env = dict(os.environ, JUDGE_LAB_DIR=str(self.base), ANSIBLE_NOCOLOR="1",
                   ANSIBLE_CONFIG=str(ANSIBLE / "ansible.cfg"), PATH=f"{BIN}:{os.environ['PATH']}")
        result = subprocess.run(argv, cwd=ANSIBLE, env=env, capture_output=True, text=True, timeout=1800)
        log = self.base / f"play-{len(self.logs):02d}-{playbook.removesuffix('.yml')}{'-check' if check else ''}.log"
        log.write_text(result.stdout + result.stderr)
        self.logs.append(log)
        self.output = result.stdout
        if result.returncode != 0:
            # The failed tasks first (a long play's tail may not reach back to them), then the tail.
            output = result.stdout + result.stderr
            failed = re.findall(r"^(?:fatal|failed): .*(?:\n[ \t]+.*){0,12}", output, re.MULTILINE)
            raise AssertionError(f"{' '.join(argv)} failed:\n" + "\n".join(failed)[:6000] +
                                 f"\n...\n{output[-4000:]}")
        recap = {}
        for host, counts in re.findall(r"^(\S+)\s+:\s+(ok=.*)$", result.stdout, re.MULTILINE):
            recap[host] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", counts)}
        assert recap, "no PLAY RECAP in the output"
        return recap

    def nodes(self) -> dict:
        import testinfra

        config = str(self.base / "ssh" / "config")
        return {h: testinfra.get_host(f"ssh://{h}", ssh_config=config) for h in self.info["hosts"]}


class Flow(threading.Thread):
    """The site's users: a submission every second, alternately right and wrong, the whole time.

    Every worker switch and rollback step (several seconds each) happens with submissions in flight;
    a faster trickle only adds judging load to the machine that also runs the seven hosts. The users
    can be sent home for a while (pause/resume), as on a quiet night."""

    def __init__(self, lab: Lab):
        super().__init__(daemon=True)
        self.lab = lab
        self.expected: dict[int, str] = {}
        self.halt = threading.Event()
        self.paused = threading.Event()
        self.errors: list[str] = []

    def run(self) -> None:
        problem = self.lab.info["problems"]["aplusb"]
        with self.lab.connect() as conn:
            user = conn.execute("INSERT INTO users (name) VALUES ('flow') ON CONFLICT (name) "
                                "DO UPDATE SET name = EXCLUDED.name RETURNING id").fetchone()[0]
        conn = None
        n = 0
        while not self.halt.wait(FLOW_SECS):
            if self.paused.is_set():
                continue
            verdict, source = ("AC", AC) if n % 2 == 0 else ("WA", WA)
            try:
                if conn is None or conn.closed:  # the site connects again (a database failover)
                    conn = self.lab.connect()
                sid = conn.execute("INSERT INTO submissions (user_id, problem_id, language, source) "
                                   "VALUES (%s, %s, 'python3', %s) RETURNING id",
                                   (user, problem, source)).fetchone()[0]
            except psycopg.Error as exc:  # a schema change holds a lock for a moment: the site retries
                self.errors.append(str(exc))
                if isinstance(exc, psycopg.OperationalError) and conn is not None:
                    conn.close()  # the server went away (a restart, a failover): connect again
                    conn = None
                continue
            self.expected[sid] = verdict
            n += 1
        if conn is not None:
            conn.close()

    def stop(self) -> None:
        self.halt.set()
        self.join(10)


@pytest.fixture(scope="module")
def lab():
    base = Path(tempfile.mkdtemp(prefix="judge-netlab-", dir="/tmp"))
    netlab = [sys.executable, str(ANSIBLE / "lab" / "netlab.py")]
    # The lab is ours while this process lives: killed before the tear-down, the next run takes it down.
    # Another run's lab in use is waited for (one lab per machine), about as long as a whole cutover run.
    up = subprocess.run([*netlab, "up", "--dir", str(base), "--owner-pid", str(os.getpid()), "--wait", "1500"],
                        capture_output=True, text=True, timeout=900 + 1500)
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        yield Lab(base)
    finally:
        down = subprocess.run([*netlab, "down", "--dir", str(base)], capture_output=True, text=True, timeout=120)
        assert down.returncode == 0, down.stderr
        # Tear-down leaves nothing of this lab running and nothing behind. Not "no lab at all": another
        # run waiting for this one may bring its own up the moment this one is down.
        remaining = _netlab().existing_lab()
        assert remaining is None or remaining.get("dir") != str(base), remaining
        assert subprocess.run(["pgrep", "-f", str(base)], capture_output=True).returncode == 1
        assert not base.exists()


def settled(lab: Lab, flow: Flow, timeout: float = 120) -> dict[str, int]:
    """Everything submitted so far is judged, with the right verdict: nothing lost, nothing stuck."""
    upto = max(flow.expected, default=0)
    deadline = time.monotonic() + timeout
    with lab.connect() as conn:
        while True:
            open_ = conn.execute("SELECT id, status, worker_id FROM submissions WHERE id <= %s "
                                 "AND status IN ('pending', 'judging') ORDER BY id", (upto,)).fetchall()
            if not open_:
                break
            assert time.monotonic() < deadline, f"stuck or lost after {timeout}s: {open_[:10]}"
            time.sleep(POLL_SECS)
        # Canaries (the gates', the standing probe's) are nobody's submissions: left out of the counts.
        rows = dict(conn.execute("SELECT id, status FROM submissions WHERE id <= %s AND canary_expect IS NULL",
                                 (upto,)).fetchall())
        stage1_schema = conn.execute("SELECT to_regclass('lease_grants') IS NOT NULL").fetchone()[0]
        if stage1_schema:
            from support.checks import assert_each_submission_decided_once_by_its_last_lease

            assert_each_submission_decided_once_by_its_last_lease(conn, expect_terminal=False)
    wrong = {sid: (rows.get(sid), verdict) for sid, verdict in flow.expected.items()
             if sid <= upto and rows.get(sid) != verdict}
    if wrong:
        with lab.connect() as conn:  # what the workers said, for the failure message
            said = conn.execute("SELECT submission_id, worker_id, verdict, detail::text FROM submission_judgings "
                                "WHERE submission_id = ANY(%s) ORDER BY id", (sorted(wrong)[:10],)).fetchall()
        assert not wrong, f"lost or misjudged (status, expected): {dict(list(wrong.items())[:10])}; judgings: {said}"
    counts: dict[str, int] = {}
    for status in rows.values():
        counts[status] = counts.get(status, 0) + 1
    return counts


def judged_since(lab: Lab, since) -> int:
    with lab.connect() as conn:
        return conn.execute("SELECT count(*) FROM submission_judgings WHERE created_at >= %s", (since,)).fetchone()[0]


def transports_used_since(lab: Lab, since) -> set[tuple[str, bool]]:
    with lab.connect() as conn:
        return set(conn.execute("SELECT DISTINCT worker_id, lease_token IS NOT NULL FROM submission_judgings "
                                "WHERE created_at >= %s", (since,)).fetchall())


def db_now(lab: Lab):
    with lab.connect() as conn:
        return conn.execute("SELECT now()").fetchone()[0]


def assert_no_change(recap: dict) -> None:
    changed = {host: c["changed"] for host, c in recap.items() if c["changed"]}
    assert not changed, f"a second run changed something: {changed}"


@pytest.fixture(scope="module")
def flow(lab):
    """One trickle of submissions for the whole module: the cutover runs under it from start to end."""
    users = Flow(lab)
    users.start()
    yield users
    users.stop()


def forward(lab: Lab, flow: Flow, stage: int) -> None:
    """One stage as an operator runs it: the --check --diff preview, the play, the play again (no change);
    then nothing is lost, stuck or misjudged and every node passes its checks."""
    passwords = lab.secrets["judge_legacy_db_passwords"]
    preview = lab.play(f"stage{stage}.yml", check=True)
    assert not any(c["failed"] for c in preview.values())
    lab.play(f"stage{stage}.yml")
    since = db_now(lab)
    assert_no_change(lab.play(f"stage{stage}.yml"))
    lab.stage = stage
    settled(lab, flow)
    node_checks.check_all(lab.nodes(), passwords, stage, lab.db_ha)
    if stage >= 2:
        # home-1 judges through the arbiter from stage 2 on: results carry lease tokens.
        assert ("home-1", True) in transports_used_since(lab, since)
    if stage == 4:
        with lab.connect() as conn:
            assert conn.execute("SELECT to_regclass('judge_dispatch_state')").fetchone() == (None,)


REFUSED = re.compile(r'^arbiter_requests_total\{[^}]*status="401"[^}]*\} (\S+)$', re.M)


def refused_by_arbiter(lab: Lab) -> float:
    """The arbiters' count of 401 answers, read on their hosts with the operator token (never on a command line)."""
    return sum(_refused_by(lab.nodes()[name]) for name in node_checks.ARBITERS)


def _refused_by(node) -> float:
    text = node.run("/usr/bin/python3 -c " + shlex.quote(
        "import ssl, urllib.request\n"
        "ctx = ssl.create_default_context(cafile='/etc/judge-arbiter/tls/ca.crt')\n"
        "token = open('/etc/judge-arbiter/operator-token').read().strip()\n"
        "r = urllib.request.Request('https://127.0.0.1:8080/metrics', headers={'Authorization': 'Bearer ' + token})\n"
        "print(urllib.request.urlopen(r, timeout=5, context=ctx).read().decode())\n"))
    assert text.rc == 0, text.stderr
    return sum(float(v) for v in REFUSED.findall(text.stdout))


def rotate_worker_credentials(lab: Lab, flow: Flow) -> None:
    """The operator puts new worker credentials into the vault and runs the stage again: the database
    rotates (the previous secret stays valid for the overlap), then each worker's file is replaced and
    the worker sends the new one. No worker request is refused, and once the overlap is over (ended
    here by the database's clock) the workers still judge: they no longer send the previous secret."""
    old = dict(lab.secrets["judge_worker_credentials"])
    new = {w: f"{w}.{secrets.token_urlsafe(32)}" for w in old}
    path = lab.base / "secrets.yml"
    text = path.read_text()
    path.write_text(re.sub(r"^judge_worker_credentials: .*$", lambda _: f"judge_worker_credentials: {json.dumps(new)}",
                           text, flags=re.M))
    lab.secrets["judge_worker_credentials"] = new
    refused = refused_by_arbiter(lab)
    lab.play(f"stage{lab.stage}.yml")
    output = "\n".join(log.read_text() for log in lab.logs[-1:])
    assert not any(c.partition(".")[2] in output for c in (*old.values(), *new.values())), "a secret in the output"
    with lab.connect() as conn:
        assert conn.execute("SELECT count(*) FROM workers WHERE previous_secret_until > now() + interval '50 minutes'"
                            ).fetchone()[0] == len(old), "every worker's previous secret keeps its overlap"
        conn.execute("UPDATE workers SET previous_secret_until = now()")  # the overlap is over
        # Announced as judgectl announces its changes: the arbiters forget what they cached.
        conn.execute("SELECT pg_notify('worker_credentials', worker_id) FROM workers")
    ended = db_now(lab)
    time.sleep(6)  # the workers' next requests: with the new credential, or refused
    since = db_now(lab)
    wait_for(lambda: ("home-1", True) in transports_used_since(lab, since), 60, POLL_SECS,
             what="home-1 to judge through the arbiter with its new credential")
    settled(lab, flow)
    assert refused_by_arbiter(lab) == refused, f"worker requests refused during the rotation (from {ended})"


def upgrade(lab: Lab, flow: Flow) -> None:
    """A new release under the flow, by upgrade.yml: the arbiters one at a time, the leader last (the
    lock handed over once), the workers one at a time. The preview and a second run change nothing
    further; nothing is lost, stuck or misjudged, no lease is granted twice for a submission (a
    reclaim would be), and exactly one arbiter leads: the one that stood by."""
    # The new release: the same wheels and a release note, so that the archive changes and every host
    # installs it again (pip reinstalls; every service restarts on it).
    (lab.base / "RELEASE").write_text(f"lab release {time.time()}\n")
    subprocess.run(["tar", "-rf", str(lab.base / "wheelhouse.tar"), "-C", str(lab.base), "RELEASE"], check=True)
    leader = node_checks.check_arbiters(lab.nodes(), lab.stage)
    preview = lab.play("upgrade.yml", check=True)
    assert not any(c["failed"] for c in preview.values())
    since = db_now(lab)
    started = time.monotonic()
    recap = lab.play("upgrade.yml")
    print(f"upgrade.yml: {time.monotonic() - started:.0f} s")
    unchanged = [h for h in lab.info["hosts"] if recap[h]["changed"] == 0]
    assert not unchanged, f"hosts that did not take the new release: {unchanged}"
    assert_no_change(lab.play("upgrade.yml"))
    settled(lab, flow)
    after = node_checks.check_arbiters(lab.nodes(), lab.stage)
    assert after != leader, f"{leader} still leads: the leader was not upgraded last, or the lock went back"
    twice = leased_twice_since(lab, since)
    assert not twice, (f"submissions leased again during the upgrade (a reclaim or a release): {twice}; "
                       f"{regrant_evidence(lab, [sid for sid, _ in twice], since)}")
    node_checks.check_all(lab.nodes(), lab.secrets["judge_legacy_db_passwords"], lab.stage, lab.db_ha)


def first_grant_after(lab: Lab, since) -> float | None:
    """Seconds from ``since`` (the database's clock) to the first lease granted after it, or None."""
    with lab.connect() as conn:
        seconds = conn.execute("SELECT extract(epoch FROM min(granted_at) - %s) FROM lease_grants "
                               "WHERE granted_at > %s", (since, since)).fetchone()[0]
    return None if seconds is None else float(seconds)


def regrant_evidence(lab: Lab, submission_ids: list[int], since) -> str:
    """For each submission leased twice: its grants (when, to whom, for which request) and what the row
    says now (releases counted, attempts): a release shows in lease_releases, an expiry does not. Then
    what the workers and the arbiters logged from a second before the first grant to a second after the
    last (the lab is torn down after the run: this is all that is left to look at)."""
    with lab.connect() as conn:
        grants = conn.execute(
            "SELECT g.submission_id, g.granted_at, g.worker_id, g.request_id, g.lease_gen, s.status, "
            "s.lease_releases, s.judge_attempts, s.lease_confirmed_at FROM lease_grants g JOIN submissions s "
            "ON s.id = g.submission_id WHERE g.submission_id = ANY(%s) AND g.granted_at >= %s "
            "ORDER BY g.submission_id, g.granted_at", (submission_ids, since)).fetchall()
    lines = [" ".join(map(str, row)) for row in grants]
    if grants:
        utc = datetime.timezone.utc
        start = min(g[1] for g in grants).astimezone(utc) - datetime.timedelta(seconds=1)
        end = max(g[1] for g in grants).astimezone(utc) + datetime.timedelta(seconds=1)
        logs = {name: "/var/log/judge-worker/worker.log" for name in node_checks.HOME + node_checks.PRODUCTION}
        logs.update({name: "/var/log/judge-arbiter/arbiter.log" for name in node_checks.ARBITERS})
        nodes = lab.nodes()
        for name, path in logs.items():
            lines.append(f"--- {name} {path}")
            lines.extend(logged_between(nodes[name], path, start, end))
    return "\n".join(lines)


def logged_between(node, path: str, start: datetime.datetime, end: datetime.datetime, limit: int = 80) -> list[str]:
    """The JSON log lines of ``path`` on ``node`` whose "ts" lies between ``start`` and ``end`` (UTC);
    the first ``limit`` of them, then how many more."""
    text = node.run(f"tail -n 20000 {shlex.quote(path)}").stdout
    fmt = "%Y-%m-%dT%H:%M:%S.%f"
    low, high = start.strftime(fmt)[:-3], end.strftime(fmt)[:-3]
    found = []
    for line in text.splitlines():
        match = re.search(r'"ts": "([^"]+)Z"', line)
        if match and low <= match.group(1) <= high:
            found.append(line[:400])
    return found[:limit] + ([f"... {len(found) - limit} more"] if len(found) > limit else [])


def leased_twice_since(lab: Lab, since) -> list:
    """Submissions granted more than one lease since ``since``: a reclaim (or a release) would be."""
    with lab.connect() as conn:
        return conn.execute("SELECT submission_id, count(*) FROM lease_grants WHERE granted_at >= %s "
                            "GROUP BY submission_id HAVING count(*) > 1", (since,)).fetchall()


DB_HOSTS = ("db-1", "db-2")
HA = ("-e", '{"judge_db_ha": true}')


def longest_wait_between_grants(lab: Lab, since) -> float:
    """The longest time between two leases granted since ``since`` (the database's clock), ``since``
    itself counting as the first."""
    with lab.connect() as conn:
        seconds = conn.execute(
            "SELECT extract(epoch FROM max(gap)) FROM (SELECT granted_at - coalesce(lag(granted_at) OVER "
            "(ORDER BY granted_at), %s) AS gap FROM lease_grants WHERE granted_at > %s) gaps",
            (since, since)).fetchone()[0]
    return float(seconds or 0)


def reachable(query, *args):
    """What ``query`` returns, or None while no database host takes writes (a failover under way)."""
    try:
        return query(*args)
    except psycopg.OperationalError:
        return None


def worker_errors(lab: Lab) -> dict[str, int]:
    """How many error lines each worker has logged so far (its log is one JSON object per line)."""
    nodes = lab.nodes()
    found = {}
    for worker in node_checks.HOME + node_checks.PRODUCTION:
        counted = nodes[worker].run("grep -c '\"level\": \"error\"' /var/log/judge-worker/worker.log")
        assert counted.rc in (0, 1), counted.stderr
        found[worker] = int(counted.stdout.strip() or 0)
    return found


def kill_host(host: str) -> None:
    """The host dies as a power cut would take it: every process of it, -9 (its sshd aside, so that
    the playbook can bring it back later as a rebooted host's would)."""
    ns = lab_netns(host)
    for pid in subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split():
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() != "sshd":
                os.kill(int(pid), 9)
        except (FileNotFoundError, ProcessLookupError):
            pass


def replicate(lab: Lab) -> None:
    """The operator replicates the database (docs/operations.md): db_ha.yml, with judge_db_ha set in
    the inventory from then on (every later play gets it). Patroni takes db-1's running server over
    and db-2 clones it as the synchronous standby."""
    lab.play("db_ha.yml", *HA)
    lab.db_ha = True
    assert node_checks.check_database(lab.nodes(), ha=True) == "db-1"


def database_failover(lab: Lab, flow: Flow) -> None:
    """The replicated database's primary host killed under the flow, brought back and handed the
    primary again on purpose, each time with nothing lost, stuck, misjudged or leased twice.

    kill -9 of every process of db-1 (Patroni, PostgreSQL, its etcd member): Patroni promotes db-2,
    the arbiters follow. db_ha.yml brings db-1 back as the standby; db_switchover.yml hands the
    primary back to it; db_ha.yml once more changes nothing."""
    if not lab.db_ha:  # run on its own (-k): the first test did not replicate this lab
        since = db_now(lab)
        replicate(lab)
        lab.play(f"stage{lab.stage}.yml")  # every client's DSN names both hosts
        settled(lab, flow)
        assert not leased_twice_since(lab, since), leased_twice_since(lab, since)
    since = db_now(lab)
    kill_host("db-1")
    wait_for(lambda: reachable(first_grant_after, lab, since) is not None, 120, POLL_SECS,
             what="a lease granted on the new primary")
    print(f"database failover: first lease {first_grant_after(lab, since):.1f} s after db-1 was killed")
    settled(lab, flow)
    assert not leased_twice_since(lab, since), \
        f"leased again after the failover (a lost result or a reclaim): {leased_twice_since(lab, since)}"

    lab.play("db_ha.yml")  # db-1 comes back, as the standby
    assert node_checks.check_database(lab.nodes(), ha=True) == "db-2"
    since = db_now(lab)
    errors = worker_errors(lab)
    lab.play("db_switchover.yml")
    print(f"database switchover: longest wait between two leases {longest_wait_between_grants(lab, since):.1f} s")
    settled(lab, flow)
    assert not leased_twice_since(lab, since), leased_twice_since(lab, since)
    # A planned hand-over is not a fault any worker should report: the arbiters ride it out.
    assert worker_errors(lab) == errors, f"workers logged errors during the switchover: {errors} -> {worker_errors(lab)}"
    assert_no_change(lab.play("db_ha.yml"))
    assert node_checks.check_database(lab.nodes(), ha=True) == "db-1"


NOWHERE = "02:00:00:00:00:01"  # a MAC address no lab host has: frames sent to it are dropped on arrival


def cut_from_database(host: str, cut: bool) -> None:
    """Cut the lines between ``host`` and the database hosts, both ways, or lift the cut.

    Each side is told a MAC address nobody has for the other (a permanent neighbour entry): frames
    go out, the bridge floods them, no host takes them. No RST, no ICMP, no local error, the hosts'
    other lines untouched: a broken link as the TCP stacks see one. (This kernel has no tc actions
    to drop with, and a blackhole route would fail the sender's calls at once.)"""
    sides = [side for db in DB_HOSTS for side in ((host, lab_address(db)), (db, lab_address(host)))]
    for at, peer in sides:
        ip = ["ip", "netns", "exec", lab_netns(at), "ip", "neigh"]
        if cut:
            subprocess.run([*ip, "replace", peer, "lladdr", NOWHERE, "dev", "eth0", "nud", "permanent"],
                           check=True, capture_output=True)
        else:
            subprocess.run([*ip, "del", peer, "dev", "eth0"], check=True, capture_output=True)


def _netlab():
    """ansible/lab/netlab.py, the lab's own module (not a package): its names for hosts and addresses."""
    if str(ANSIBLE / "lab") not in sys.path:
        sys.path.insert(0, str(ANSIBLE / "lab"))
    import netlab

    return netlab


def lab_netns(host: str) -> str:
    return _netlab().netns(host)


def lab_address(host: str) -> str:
    return _netlab().address(host)


def arbiter_takeovers(lab: Lab, flow: Flow) -> None:
    """The leading arbiter dies (kill -9 of its process group; supervisord starts it again), then the
    new leader is cut from the database only (its workers still reach it): each time the standby takes
    the lock and grants, the other comes back as the standby, and nothing is lost, stuck, misjudged or
    leased twice (a lease reclaimed from a worker that kept judging would be)."""
    nodes = lab.nodes()
    leader = node_checks.leader_among(nodes)
    assert leader is not None, "exactly one arbiter leads before the takeovers"
    standby = next(name for name in node_checks.ARBITERS if name != leader)
    # kill -9: the master's process group (supervisord starts each program in a group of its own).
    supervisorctl = node_checks.SUPERVISORCTL.format(name="judge-arbiter")
    pid = int(nodes[leader].check_output(f"{supervisorctl} pid judge-arbiter"))
    since = db_now(lab)
    nodes[leader].run_expect([0], f"kill -9 -- -{pid}")
    wait_for(lambda: node_checks.leader_among(nodes) == standby, 60, POLL_SECS, what=f"{standby} to lead")
    wait_for(lambda: first_grant_after(lab, since) is not None, 60, POLL_SECS, what="a lease after the kill")
    took_over = first_grant_after(lab, since)
    print(f"arbiter takeover after kill -9 of {leader}: first lease {took_over:.1f} s after the kill")
    wait_for(lambda: node_checks.readiness(nodes[leader])[0] == node_checks.STANDING_BY, 60, POLL_SECS,
             what=f"{leader} back as the standby")
    settled(lab, flow)
    assert not leased_twice_since(lab, since), leased_twice_since(lab, since)

    # The new leader loses the database, not its workers: the database ends its sessions (TCP
    # keepalives), the lock goes to the old leader, now standing by.
    leader, standby = standby, leader
    since = db_now(lab)
    cut_from_database(leader, True)
    try:
        wait_for(lambda: node_checks.leader_among(nodes) == standby, 60, POLL_SECS, what=f"{standby} to lead")
        wait_for(lambda: first_grant_after(lab, since) is not None, 60, POLL_SECS, what="a lease after the cut")
        took_over = first_grant_after(lab, since)
        print(f"arbiter takeover after {leader} was cut from the database: first lease {took_over:.1f} s after the cut")
    finally:
        cut_from_database(leader, False)
    wait_for(lambda: node_checks.readiness(nodes[leader])[0] == node_checks.STANDING_BY, 60, POLL_SECS,
             what=f"{leader} back as the standby once the cut is lifted")
    settled(lab, flow)
    assert not leased_twice_since(lab, since), leased_twice_since(lab, since)
    node_checks.check_all(nodes, lab.secrets["judge_legacy_db_passwords"], lab.stage, lab.db_ha)


def prometheus(path: str, **params) -> dict:
    """The lab's Prometheus (monitoring.yml put it on arbiter-2, listening on the bridge): its API's data."""
    url = f"http://{lab_address('arbiter-2')}:9090{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=10) as reply:
        answer = json.loads(reply.read())
    assert answer["status"] == "success", answer
    return answer["data"]


def alert_state(name: str) -> str | None:
    states = [a["state"] for a in prometheus("/api/v1/alerts")["alerts"] if a["labels"]["alertname"] == name]
    return "firing" if "firing" in states else (states[0] if states else None)


def monitoring(lab: Lab, flow: Flow) -> None:
    """monitoring.yml as the operator runs it: Prometheus (Debian's) on arbiter-2 scrapes both arbiters
    over HTTPS with the operator token and loads the alert rules; a second run changes nothing. Then a
    backlog made on purpose (every worker stopped, the oldest waiting submission ten minutes old by its
    created_at) fires JudgeBacklog at the real server, and it resolves once the workers are back."""
    lab.play("monitoring.yml")
    assert_no_change(lab.play("monitoring.yml"))
    targets = prometheus("/api/v1/targets", state="active")["activeTargets"]
    assert sorted((t["scrapeUrl"], t["health"]) for t in targets) == sorted(
        (f"https://{lab_address(a)}:8080/metrics", "up") for a in node_checks.ARBITERS), targets
    rules = {r["name"] for g in prometheus("/api/v1/rules")["groups"] for r in g["rules"]}
    assert {"JudgeBacklog", "JudgeSubmissionSystemError", "JudgeNoArbiterLeads"} <= rules, rules
    wait_for(lambda: prometheus("/api/v1/query", query="arbiter_queue_submissions")["result"], 30, 1,
             what="the queue's depth in Prometheus")
    assert alert_state("JudgeBacklog") is None

    nodes = lab.nodes()
    workers = sorted(h for h in nodes if h.startswith(("home", "prod")))
    supervisorctl = node_checks.SUPERVISORCTL.format(name="judge-worker")
    for host in workers:
        nodes[host].run_expect([0], f"{supervisorctl} stop judge-worker")
    try:
        def backdated() -> bool:
            # The submission the gauge reads (sql/operator.sql oldest_pending_age): the oldest pending one
            # never decided. (The oldest pending one may have been decided and rejudged: the gauge skips
            # it, and backdating it would fire nothing.)
            with lab.connect() as conn:
                return conn.execute(
                    "UPDATE submissions SET created_at = now() - interval '10 minutes' WHERE id = (SELECT min(s.id) "
                    "FROM submissions s WHERE s.status = 'pending' AND s.canary_expect IS NULL AND NOT EXISTS "
                    "(SELECT 1 FROM submission_judgings j WHERE j.submission_id = s.id)) RETURNING id"
                ).fetchone() is not None
        wait_for(backdated, 30, 1, what="a submission waiting while every worker is stopped")
        # The rule's "for: 2m", a scrape and an evaluation (2 s each here).
        try:
            wait_for(lambda: alert_state("JudgeBacklog") == "firing", 180, 2, what="JudgeBacklog to fire")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {backlog_evidence(lab)}") from None
    finally:
        for host in workers:
            nodes[host].run_expect([0], f"{supervisorctl} start judge-worker")
    settled(lab, flow)
    wait_for(lambda: alert_state("JudgeBacklog") is None, 60, 2, what="JudgeBacklog to resolve")


def backlog_evidence(lab: Lab) -> dict:
    """What a JudgeBacklog that did not fire leaves to look at: the gauge as each arbiter exported it
    over the last 3 minutes, the alert's state, and the queue as the database has it now."""
    series = prometheus("/api/v1/query", query="arbiter_oldest_pending_seconds[3m]")["result"]
    with lab.connect() as conn:
        queue = conn.execute(
            "SELECT s.id, s.status, s.created_at, s.worker_id, (SELECT count(*) FROM submission_judgings j "
            "WHERE j.submission_id = s.id) AS judgings FROM submissions s WHERE s.status IN ('pending', 'judging') "
            "AND s.canary_expect IS NULL ORDER BY s.id LIMIT 5").fetchall()
    return {"alert": alert_state("JudgeBacklog"), "queue": [tuple(map(str, row)) for row in queue],
            "gauge": {r["metric"].get("instance"): [v for _, v in r["values"]][-90::10] for r in series}}


def reach_stage(lab: Lab, stage: int) -> None:
    """Where a test starts when it runs on its own (-k): one converge to that stage."""
    if lab.stage != stage:
        lab.play("site.yml", "-e", f"judge_cutover_stage={stage}")
        lab.stage = stage


def last_submission_id(lab: Lab) -> int:
    with lab.connect() as conn:
        return conn.execute("SELECT coalesce(max(id), 0) FROM submissions").fetchone()[0]


def gates_since(lab: Lab, after_id: int) -> list[tuple[str, "canary.Outcome"]]:
    """The gates a play ran, read from the database rather than from the play's folded YAML: every
    canary pinned to a worker queued after ``after_id``, as (pinned worker, outcome), in order."""
    from arbiter.store import canary

    with lab.connect() as conn:
        rows = conn.execute("SELECT id, pinned_worker FROM submissions WHERE id > %s AND canary_expect IS NOT NULL "
                            "AND pinned_worker IS NOT NULL ORDER BY id", (after_id,)).fetchall()
        return [(worker, canary.outcome(conn, sid)) for sid, worker in rows]


def assert_gates(lab: Lab, after_id: int, workers: list[str], through: str) -> list[str]:
    """Exactly one gate per switched worker, each decided AC by that worker through ``through``, each
    shown by the play with its timings. Returns the lines shown."""
    gates = gates_since(lab, after_id)
    where = f"(full output: {lab.logs[-1]})"
    assert sorted(w for w, _ in gates) == sorted(workers), (
        f"gates run {[(w, o.submission_id, o.status) for w, o in gates]}, expected one for each of {workers} "
        f"{where}\n{gate_tasks(lab.output)}")
    shown = " ".join(lab.output.split())  # the play prints YAML, which folds a long line at a space
    lines = []
    for worker, outcome in gates:
        assert (outcome.status, outcome.worker_id, outcome.transport) == ("AC", worker, through), (outcome, where)
        assert outcome.queued_s >= 0 and outcome.judging_s >= 0, (outcome, where)
        line = f"canary #{outcome.submission_id} (c) on {worker} through {through}: AC as expected; {outcome.timings()}"
        assert line in shown, f"the play did not show {line!r} {where}\n{gate_tasks(lab.output)}"
        lines.append(line)
    return lines


def gate_tasks(output: str) -> str:
    """The play's gate tasks and what each printed, for a failure message."""
    tasks = re.findall(r"^TASK \[[^\]]*(?:gate|Switch|restarts)[^\]]*\].*?(?=^TASK |^PLAY RECAP)", output, re.M | re.S)
    return "".join(tasks)[-6000:]


def test_the_documented_procedure_passes_on_an_idle_lab(lab):
    """docs/cutover.md as written, nobody submitting: stage 0 converge, stages 1-4, the rollback,
    on the replicated database (docs/operations.md: db_ha.yml first, on the legacy site).

    Every gate is a canary pinned to the switched worker, so a quiet site passes in seconds; each
    switch's play shows its gate's line with the canary's timings. The tests after this one run on
    the replicated database too."""
    with lab.connect() as conn:
        assert conn.execute("SELECT count(*) FROM submissions").fetchone() == (0,)
    replicate(lab)
    homes = sorted(h for h in lab.info["hosts"] if h.startswith("home"))
    prods = sorted(h for h in lab.info["hosts"] if h.startswith("prod"))
    switched = {0: homes + prods, 1: [], 2: homes[:1], 3: homes[1:], 4: prods}
    for stage in range(5):
        started = time.monotonic()
        before = last_submission_id(lab)
        if stage == 0:
            lab.play("site.yml", "-e", "judge_cutover_stage=0")
        else:
            lab.play(f"stage{stage}.yml")
        lines = assert_gates(lab, before, switched[stage], "arbiter" if stage >= 2 else "direct")
        lab.stage = stage
        print(f"stage {stage}: {time.monotonic() - started:.0f}s; gates: {lines}")
    before = last_submission_id(lab)
    lab.play("rollback.yml")
    assert_gates(lab, before, homes + prods, "direct")
    lab.stage = 0
    with lab.connect() as conn:
        # Nothing but canaries was judged, each right, and none credited to anyone.
        assert conn.execute("SELECT count(*) FROM submissions WHERE canary_expect IS NULL").fetchone() == (0,)
        assert conn.execute("SELECT DISTINCT status FROM submissions").fetchall() == [("AC",)]
        assert conn.execute("SELECT count(*) FROM first_passes").fetchone() == (0,)
        assert conn.execute("SELECT coalesce(sum(xp), 0) FROM users").fetchone() == (0,)
    node_checks.check_all(lab.nodes(), lab.secrets["judge_legacy_db_passwords"], 0, lab.db_ha)


# The three tests below are one cutover, in order, on one lab and under one flow of submissions:
# the legacy site and stage 1; a gate that fails at stage 2; stages 2-4 and the rollback to 0.


def test_the_legacy_site_then_stage_1(lab, flow):
    # The legacy site as it runs today: every worker on its DB account, no arbiter. The first test's
    # rollback left the lab there and checked every node; run on its own (or after a first test
    # that stopped half-way) the lab is converged to it and checked here.
    if lab.stage != 0:
        lab.play("site.yml", "-e", "judge_cutover_stage=0")
        lab.stage = 0
        node_checks.check_all(lab.nodes(), lab.secrets["judge_legacy_db_passwords"], 0, lab.db_ha)
    settled(lab, flow)
    forward(lab, flow, 1)


def test_a_worker_that_fails_its_gate_is_put_back_and_the_play_stops(lab, flow):
    """Gate failure: the switched worker gets its previous config back; no other worker is touched.

    home-1's copy of the canary problem's test data is corrupted (a directory of that name in its
    test data comes before the packaged one), so at stage 2 its gate's canary gets WA: the play
    stops within seconds, naming the verdict."""
    reach_stage(lab, 1)
    settled(lab, flow)
    nodes = lab.nodes()
    corrupt = "/var/lib/judge-worker/testdata/judge-canary"
    assert nodes["home-1"].run(f"mkdir {corrupt} && printf '1 2\\n' > {corrupt}/1.in && "
                               f"printf '4\\n' > {corrupt}/1.out").rc == 0
    first_new = last_submission_id(lab)
    try:
        before = {h: n.file("/etc/judge-worker/worker.toml").content_string
                  for h, n in nodes.items() if h.startswith(("home", "prod"))}
        argv = [str(BIN / "ansible-playbook"), "-i", "inventories/lab", "stage2.yml", "-e",
                f"@{lab.base}/secrets.yml", *(HA if lab.db_ha else ())]
        env = dict(os.environ, JUDGE_LAB_DIR=str(lab.base), ANSIBLE_NOCOLOR="1",
                   PATH=f"{BIN}:{os.environ['PATH']}")
        result = subprocess.run(argv, cwd=ANSIBLE, env=env, capture_output=True, text=True, timeout=900)
        (lab.base / "play-gate-failure.log").write_text(result.stdout + result.stderr)
    finally:
        assert nodes["home-1"].run(f"rm -r {corrupt}").rc == 0
    # The lab stays at stage 1 plus whatever stage 2 did before home-1's gate (the arbiter's play):
    # the operator's next step is stage 2 again, and the next test takes exactly that step.
    assert result.returncode != 0
    # The gate's canary, read from the database: home-1's alone (no worker after it was touched), WA.
    gates = gates_since(lab, first_new)
    assert [(w, o.status, o.transport) for w, o in gates] == [("home-1", "WA", "arbiter")], gates
    # The play's failure names the worker and the verdict (its YAML folds long lines at spaces).
    shown = " ".join(result.stdout.split())
    assert (f"home-1 failed its gate through transport arbiter (judgectl: error: canary #{gates[0][1].submission_id} "
            f"(c) on home-1 through arbiter: verdict WA, expected AC") in shown, result.stdout[-3000:]
    after = {h: nodes[h].file("/etc/judge-worker/worker.toml").content_string for h in before}
    assert after == before, "home-1 is back on its previous configuration, the others untouched"
    assert 'transport = "direct"' in after["home-1"]
    for h in before:
        assert "RUNNING" in nodes[h].run(node_checks.SUPERVISORCTL.format(name="judge-worker") +
                                         " status judge-worker").stdout
    # The workers judge on through the failed play: nothing submitted meanwhile is lost or stuck.
    settled(lab, flow)


def test_stages_2_to_4_then_rollback_step_by_step(lab, flow):
    """From stage 1, or where the failed gate left it (stage 2 then simply runs again, as an operator
    runs it once the cause is fixed)."""
    reach_stage(lab, 1)
    passwords = lab.secrets["judge_legacy_db_passwords"]
    for stage in (2, 3, 4):
        forward(lab, flow, stage)
    monitoring(lab, flow)
    database_failover(lab, flow)
    upgrade(lab, flow)
    arbiter_takeovers(lab, flow)
    rotate_worker_credentials(lab, flow)

    for target in (3, 2, 1, 0):
        lab.play("rollback.yml", "-e", f"judge_rollback_to={target}")
        lab.stage = target
        settled(lab, flow)
        node_checks.check_all(lab.nodes(), passwords, target, lab.db_ha)
        if target == 3:
            with lab.connect() as conn:
                assert conn.execute("SELECT count(*) FROM judge_dispatch_state").fetchone() == (1,)
    preview = lab.play("rollback.yml", check=True)
    assert_no_change(preview)
    assert_no_change(lab.play("rollback.yml"))
    since = db_now(lab)
    wait_for(lambda: judged_since(lab, since) > 0, 60, POLL_SECS, what="a legacy worker to judge after the rollback")
    counts = settled(lab, flow)
    with lab.connect() as conn:
        # Back on the stage-0 schema (no lease columns at all), and the legacy workers judge.
        assert conn.execute("SELECT max(version) FROM schema_migrations").fetchone() == (2,)
    assert judged_since(lab, since) > 0
    flow.stop()
    final = settled(lab, flow)
    assert set(final) <= {"AC", "WA"} and final["AC"] >= 50 and final["WA"] >= 50, (counts, final)

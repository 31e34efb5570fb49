"""netlab: the cutover lab -- seven hosts on one machine, reached over SSH like real ones.

Each host is a network namespace (its own address on the bridge ``jlab0``) and a
mount namespace with overlays on /etc, /opt, /var and /run and its own /root, so what Ansible
installs on ``home-1`` lands in that host's own /etc/judge-worker and
/opt/judge-arbiter and nowhere else. An sshd per host is the only process the
lab starts there; everything else (supervisord, the arbiter, the workers) is
started by the playbooks, through SSH. The ``db-1`` host also runs PostgreSQL,
listening on its address with SCRAM passwords for the other hosts, and already
holds a legacy (baseline) site: the cutover starts from a running legacy judge.
``db-2`` starts empty: ansible/db_ha.yml replicates the database onto it (Patroni, etcd).

    python ansible/lab/netlab.py up   --dir /tmp/judge-netlab     # prints export JUDGE_LAB_DIR=...
    python ansible/lab/netlab.py down --dir /tmp/judge-netlab     # kills everything, removes it all

One lab per machine (its addresses are the lab inventory's). ``up`` finds a lab already there and
tells a stale one from one in use: a lab whose namespaces hold no process (its machine restarted)
or whose owner has died (``--owner-pid``: a test run killed before its tear-down) is taken down
first; a lab in use is waited for (``--wait`` seconds), then refused with its owner named.

Needs root, iproute2, openssh-server, util-linux (unshare) and PostgreSQL's server binaries.
Run it with the project's virtualenv (it applies the baseline migration with arbiter.store.migrations).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

BRIDGE = "jlab0"
SUBNET = "10.231.0"
LOCK = Path("/run/judge-netlab.lock")  # held while a lab comes up: two 'up's never interleave
HOSTS = {"db-1": 10, "db-2": 11, "arbiter-1": 20, "arbiter-2": 21, "home-1": 31, "home-2": 32, "prod-1": 41}
WORKERS = ("home-1", "home-2", "prod-1")
OVERLAID = ("etc", "opt", "var", "run")
PROBLEMS = {  # slug: test cases; the lab's site has these problems before the cutover starts
    "aplusb": [("1 2\n", "3\n"), ("10 20\n", "30\n"), ("-5 5\n", "0\n")],
    "reverse": [("abc\n", "cba\n"), ("racecar\n", "racecar\n")],
}


class LabError(RuntimeError):
    pass


def _process_start(pid: int) -> str | None:
    """The kernel's start time of a process (field 22 of /proc/PID/stat): a pid with its start time
    names one process, even after the pid is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def remove_namespaces(prefix: str, bridge: str, veth_prefix: str) -> list[str]:
    """Every network namespace named ``prefix``*, each once its processes are killed, and the bridge;
    returns the veths still there after 10 s (none, normally). The netlab's tear-down and the chaos
    run's (tests/chaos/network.py) both use it. The kill-until-empty loop has the shape of
    worker/sandbox/cgroups.py's (a cgroup there, a namespace here); kept apart on purpose: the lab
    tool imports nothing of the worker."""
    for ns in [name for name in sh("ip", "netns", "list", check=False).stdout.split() if name.startswith(prefix)]:
        for _ in range(50):
            pids = [int(p) for p in sh("ip", "netns", "pids", ns, check=False).stdout.split()]
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        sh("ip", "netns", "del", ns, check=False)
    sh("ip", "link", "del", bridge, check=False)
    # A namespace goes away asynchronously once its last process is reaped; so do its veths.
    deadline = time.monotonic() + 10
    while True:
        links = [line.split(":")[1].strip().split("@")[0]
                 for line in sh("ip", "-o", "link", "show", check=False).stdout.splitlines()]
        leftover = [name for name in links if name.startswith(veth_prefix)]
        if not leftover or time.monotonic() > deadline:
            return leftover
        for name in leftover:
            sh("ip", "link", "del", name, check=False)
        time.sleep(0.2)


def _lab_namespaces() -> list[str]:
    return [name for name in sh("ip", "netns", "list", check=False).stdout.split() if name.startswith("jlab-")]


def existing_lab() -> dict | None:
    """The lab up on this machine, if any: what its bridge says of it (dir, owner) and whether it is
    stale, i.e. nobody uses it any more."""
    shown = sh("ip", "-j", "link", "show", BRIDGE, check=False)
    if shown.returncode != 0:
        return None
    try:
        found = json.loads(json.loads(shown.stdout)[0].get("ifalias") or "{}")
    except ValueError:
        found = {}
    processes = sum(len(sh("ip", "netns", "pids", ns, check=False).stdout.split()) for ns in _lab_namespaces())
    owner = found.get("owner")
    owner_gone = owner is not None and _process_start(owner) != found.get("owner_start")
    found.update(processes=processes, stale=processes == 0 or owner_gone,
                 why=("its namespaces hold no process" if processes == 0 else
                      f"its owner (pid {owner}) is gone" if owner_gone else ""))
    return found


def clear_the_way(wait: float) -> None:
    """Before a lab comes up: take a stale lab down; wait up to ``wait`` seconds for one in use."""
    deadline = time.monotonic() + wait
    announced = False
    while (found := existing_lab()) is not None:
        if found["stale"]:
            print(f"netlab: taking down a stale lab ({found.get('dir', 'directory unknown')}): {found['why']}",
                  file=sys.stderr)
            Lab(Path(found["dir"]) if found.get("dir") else None).down(remove=bool(found.get("dir")))
            continue
        owner = f"owner pid {found['owner']}" if found.get("owner") else "no owner recorded"
        in_use = f"a lab is up and in use ({owner}, {found.get('dir', 'directory unknown')}, " \
                 f"{found['processes']} processes)"
        if time.monotonic() >= deadline:
            raise LabError(f"{in_use}; 'down' it first")
        if not announced:
            print(f"netlab: {in_use}; waiting up to {wait:.0f} s for it to go down", file=sys.stderr)
            announced = True
        time.sleep(2)


def sh(*argv: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    if check and result.returncode != 0:
        raise LabError(f"{' '.join(argv)}: {result.stderr.strip() or result.stdout.strip()}")
    return result


def netns(host: str) -> str:
    return f"jlab-{host}"


def address(host: str) -> str:
    return f"{SUBNET}.{HOSTS[host]}"


class Lab:
    def __init__(self, base: Path | None):
        # None: a stale lab whose directory is not known (one brought up before labs recorded it).
        self.base = base.resolve() if base is not None else None
        self.ssh = self.base / "ssh" if base is not None else None
        self.pg = self.base / "pg" if base is not None else None
        self.owner_pid: int | None = None

    # -- network -------------------------------------------------------------------
    def _network(self) -> None:
        sh("ip", "link", "add", BRIDGE, "type", "bridge")
        # The bridge carries who brought the lab up, so that the next 'up' can tell a stale lab.
        record = {"dir": str(self.base)}
        if self.owner_pid is not None:
            record.update(owner=self.owner_pid, owner_start=_process_start(self.owner_pid))
        sh("ip", "link", "set", "dev", BRIDGE, "alias", json.dumps(record, separators=(",", ":")))
        sh("ip", "addr", "add", f"{SUBNET}.1/24", "dev", BRIDGE)
        sh("ip", "link", "set", BRIDGE, "up")
        for host in HOSTS:
            ns = netns(host)
            outer = f"jlv-{host}"[:15]
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", outer, "type", "veth", "peer", "name", "eth0", "netns", ns)
            sh("ip", "link", "set", outer, "master", BRIDGE)
            sh("ip", "link", "set", outer, "up")
            sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{address(host)}/24", "dev", "eth0")
            sh("ip", "netns", "exec", ns, "ip", "link", "set", "eth0", "up")
            sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")

    # -- ssh -----------------------------------------------------------------------
    def _keys(self) -> None:
        self.ssh.mkdir(mode=0o700, parents=True)
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.ssh / "id_ed25519"))
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.ssh / "host_ed25519"))
        shutil.copy(self.ssh / "id_ed25519.pub", self.ssh / "authorized_keys")
        lines = []
        for host in HOSTS:
            lines += [f"Host {host}", f"  HostName {address(host)}", "  User root",
                      f"  IdentityFile {self.ssh / 'id_ed25519'}", "  StrictHostKeyChecking no",
                      "  UserKnownHostsFile /dev/null", "  LogLevel ERROR", "  ControlMaster auto",
                      f"  ControlPath {self.ssh}/tcm-%h", "  ControlPersist 60s", ""]
        (self.ssh / "config").write_text("\n".join(lines))

    def _start_host(self, host: str) -> None:
        root = self.base / "hosts" / host
        mounts = []
        for top in OVERLAID:
            upper, work = root / "upper" / top, root / "work" / top
            upper.mkdir(parents=True)
            work.mkdir(parents=True)
            mounts.append(f"mount -t overlay overlay -o lowerdir=/{top},upperdir={upper},workdir={work} /{top}")
        # A host's own home for root: not the controller's, whose shell start-up files (pyenv, cargo)
        # would run on every SSH command, i.e. on every Ansible module run and every testinfra check.
        home = root / "root"
        home.mkdir(mode=0o700)
        mounts.append(f"mount --bind {home} /root")
        config = self.ssh / f"sshd_{host}"
        config.write_text("\n".join([
            f"ListenAddress {address(host)}:22", f"HostKey {self.ssh / 'host_ed25519'}",
            f"AuthorizedKeysFile {self.ssh / 'authorized_keys'}", "PermitRootLogin prohibit-password",
            "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no",
            "Subsystem sftp internal-sftp", "LogLevel ERROR", f"PidFile /run/sshd-{host}.pid", ""]))
        # The hostname is for humans reading supervisor logs; the overlays make /etc etc. this host's own.
        script = " && ".join(mounts + ["mkdir -p /run/sshd", f"echo {host} > /etc/hostname",
                                       f"exec /usr/sbin/sshd -D -e -f {config}"])
        log = open(self.base / f"sshd-{host}.log", "ab")
        subprocess.Popen(["ip", "netns", "exec", netns(host), "unshare", "--mount", "--uts", "--propagation",
                          "private", "--", "sh", "-c", f"hostname {host} && {script}"],
                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def _wait_ssh(self, host: str, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while True:
            r = sh("ssh", "-F", str(self.ssh / "config"), "-o", "ConnectTimeout=2", host, "true", check=False)
            if r.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise LabError(f"sshd on {host} does not answer: {r.stderr.strip()}")
            time.sleep(0.2)

    # -- the database host -----------------------------------------------------------
    def _postgres(self) -> None:
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
        from arbiter.lab.devcluster import LocalCluster

        cluster = LocalCluster(self.pg, port=5432, fast=True, settings={
            "listen_addresses": f"'{address('db-1')},127.0.0.1'", "password_encryption": "'scram-sha-256'"})
        cluster.init()
        (cluster.data_dir / "pg_hba.conf").write_text(
            "# the lab: the superuser over the socket (judgectl on the db host), passwords from the hosts\n"
            "local all postgres trust\n"
            "local all all scram-sha-256\n"
            "host all postgres 127.0.0.1/32 trust\n"
            f"host all all {SUBNET}.0/24 scram-sha-256\n")
        postgres = pwd.getpwnam("postgres")
        os.chown(cluster.data_dir / "pg_hba.conf", postgres.pw_uid, postgres.pw_gid)
        sh("ip", "netns", "exec", netns("db-1"), "runuser", "-u", "postgres", "--",
           str(cluster.bindir / "pg_ctl"), "-D", str(cluster.data_dir), "-l", str(self.pg / "postgres.log"),
           "-w", "-t", "30", "-o", "-p 5432", "start", cwd=str(self.pg))

    def admin_dsn(self, dbname: str = "judge") -> str:
        return f"host={self.pg} port=5432 dbname={dbname} user=postgres"

    def _legacy_site(self) -> dict[str, int]:
        """The site before the cutover: baseline schema, problems with test data on the controller."""
        import psycopg

        from arbiter.store import migrations

        with psycopg.connect(self.admin_dsn("postgres"), autocommit=True) as admin:
            admin.execute("CREATE DATABASE judge")
        problems = {}
        with psycopg.connect(self.admin_dsn(), autocommit=True) as conn:
            migrations.migrate(conn, "baseline")
            for slug, cases in PROBLEMS.items():
                pid = conn.execute("INSERT INTO problems (slug, title, memory_limit_kb) VALUES (%s, %s, 131072) "
                                   "RETURNING id", (slug, slug)).fetchone()[0]
                problems[slug] = pid
                d = self.base / "testdata" / str(pid)
                d.mkdir(parents=True)
                for i, (given, expected) in enumerate(cases, 1):
                    (d / f"{i}.in").write_text(given)
                    (d / f"{i}.out").write_text(expected)
        return problems

    def _secrets(self) -> None:
        values = {
            "judge_arbiter_db_password": secrets.token_urlsafe(24),
            "judge_arbiter_operator_token": secrets.token_urlsafe(24),
            "judge_worker_credentials": {w: f"{w}.{secrets.token_urlsafe(32)}" for w in WORKERS},
            "judge_legacy_db_passwords": {w: secrets.token_urlsafe(24) for w in WORKERS},
            # db_ha.yml (the database replicated by Patroni across db-1 and db-2)
            "judge_db_superuser_password": secrets.token_urlsafe(24),
            "judge_db_replication_password": secrets.token_urlsafe(24),
        }
        path = self.base / "secrets.yml"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("---\n# The lab's secrets (an ansible-vault file in production). JSON is YAML.\n")
            for key, value in values.items():
                f.write(f"{key}: {json.dumps(value)}\n")

    def _wheelhouse(self, repo: Path) -> None:
        # The operator's release step, as is: the project and its dependencies as one tar of wheels.
        sh("bash", str(repo / "ansible" / "build-wheelhouse.sh"), str(self.base / "wheelhouse.tar"),
           env=dict(os.environ, PYTHON=sys.executable), timeout=600)

    # -- lifecycle ---------------------------------------------------------------------
    def up(self, owner_pid: int | None = None, wait: float = 0) -> dict:
        if os.geteuid() != 0:
            raise LabError("the lab needs root (network namespaces, mounts)")
        if owner_pid is not None and _process_start(owner_pid) is None:
            raise LabError(f"--owner-pid {owner_pid}: no such process")
        if self.base.exists() and any(self.base.iterdir()):
            raise LabError(f"{self.base} is not empty; 'down' it first")
        self.owner_pid = owner_pid
        with open(LOCK, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            clear_the_way(wait)
            return self._bring_up()

    def _bring_up(self) -> dict:
        self.base.mkdir(parents=True, exist_ok=True)
        self.base.chmod(0o755)  # the postgres OS user reaches its socket below this directory
        repo = Path(__file__).resolve().parents[2]
        try:
            self._network()
            self._keys()
            for host in HOSTS:
                self._start_host(host)
            self._postgres()
            problems = self._legacy_site()
            self._secrets()
            self._wheelhouse(repo)
            for host in HOSTS:
                self._wait_ssh(host)
        except BaseException:
            self.down(remove=False)
            raise
        info = {"dir": str(self.base), "hosts": {h: address(h) for h in HOSTS}, "problems": problems,
                "admin_dsn": self.admin_dsn(), "inventory": str(repo / "ansible" / "inventories" / "lab")}
        (self.base / "lab.json").write_text(json.dumps(info, indent=2))
        return info

    def down(self, remove: bool = True) -> None:
        """Everything the lab started dies with its namespaces; nothing keeps running."""
        # Every jlab-* namespace, not only today's HOSTS: a lab left by another version goes too.
        remove_namespaces("jlab-", BRIDGE, "jlv-")
        # The controller's side: SSH connection masters (ControlPersist) of Ansible and testinfra.
        if self.ssh is not None:
            sh("pkill", "-f", f"{self.ssh}/", check=False)
        if remove and self.base is not None:
            shutil.rmtree(self.base, ignore_errors=True)
        if self.base is not None:  # the etcd members' data (the lab inventory keeps it in memory)
            shutil.rmtree(Path("/dev/shm") / self.base.name, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="netlab", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["up", "down"])
    parser.add_argument("--dir", default="/tmp/judge-netlab", help="the lab's directory (default %(default)s)")
    parser.add_argument("--owner-pid", type=int, help="up: the process the lab is for; once it is gone, "
                        "the next 'up' takes this lab down as stale (default: none; stale only when no "
                        "process is left in its namespaces)")
    parser.add_argument("--wait", type=float, default=0, metavar="SECONDS",
                        help="up: how long to wait for a lab in use to go down (default %(default)s)")
    args = parser.parse_args(argv)
    lab = Lab(Path(args.dir))
    try:
        if args.command == "up":
            info = lab.up(owner_pid=args.owner_pid, wait=args.wait)
            print(json.dumps(info, indent=2))
            print(f"export JUDGE_LAB_DIR={lab.base}")
        else:
            lab.down()
    except LabError as exc:
        print(f"netlab: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""netlab: the cutover lab -- five hosts on one machine, reached over SSH like real ones.

Each host is a network namespace (its own address on the bridge ``jlab0``) and a
mount namespace with overlays on /etc, /opt, /var and /run and its own /root, so what Ansible
installs on ``home-1`` lands in that host's own /etc/judge-worker and
/opt/judge-arbiter and nowhere else. An sshd per host is the only process the
lab starts there; everything else (supervisord, the arbiter, the workers) is
started by the playbooks, through SSH. The ``db`` host also runs PostgreSQL,
listening on its address with SCRAM passwords for the other hosts, and already
holds a legacy (baseline) site: the cutover starts from a running legacy judge.

    python ansible/lab/netlab.py up   --dir /tmp/judge-netlab     # prints export JUDGE_LAB_DIR=...
    python ansible/lab/netlab.py down --dir /tmp/judge-netlab     # kills everything, removes it all

Needs root, iproute2, openssh-server, util-linux (unshare) and PostgreSQL's server binaries.
Run it with the project's virtualenv (it applies the baseline migration with arbiter.migrations).
"""

from __future__ import annotations

import argparse
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
HOSTS = {"db-1": 10, "arbiter-1": 20, "home-1": 31, "home-2": 32, "prod-1": 41}
WORKERS = ("home-1", "home-2", "prod-1")
OVERLAID = ("etc", "opt", "var", "run")
PROBLEMS = {  # slug: test cases; the lab's site has these problems before the cutover starts
    "aplusb": [("1 2\n", "3\n"), ("10 20\n", "30\n"), ("-5 5\n", "0\n")],
    "reverse": [("abc\n", "cba\n"), ("racecar\n", "racecar\n")],
}


class LabError(RuntimeError):
    pass


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
    def __init__(self, base: Path):
        self.base = base.resolve()
        self.ssh = self.base / "ssh"
        self.pg = self.base / "pg"

    # -- network -------------------------------------------------------------------
    def _network(self) -> None:
        sh("ip", "link", "add", BRIDGE, "type", "bridge")
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
        from arbiter.devcluster import LocalCluster

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

        from arbiter import migrations

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
    def up(self) -> dict:
        if os.geteuid() != 0:
            raise LabError("the lab needs root (network namespaces, mounts)")
        if self.base.exists() and any(self.base.iterdir()):
            raise LabError(f"{self.base} is not empty; 'down' it first")
        self.base.mkdir(parents=True, exist_ok=True)
        self.base.chmod(0o755)  # the postgres OS user reaches its socket below this directory
        if sh("ip", "link", "show", BRIDGE, check=False).returncode == 0:
            raise LabError(f"a lab is already up (bridge {BRIDGE} exists); 'down' it first")
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
        listed = sh("ip", "netns", "list", check=False).stdout.split()
        for ns in [name for name in listed if name.startswith("jlab-")]:
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
        sh("ip", "link", "del", BRIDGE, check=False)
        # The controller's side: SSH connection masters (ControlPersist) of Ansible and testinfra.
        sh("pkill", "-f", f"{self.ssh}/", check=False)
        # A namespace goes away asynchronously once its last process is reaped; so do its veths.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            links = [line.split(":")[1].strip().split("@")[0]
                     for line in sh("ip", "-o", "link", "show", check=False).stdout.splitlines()]
            leftover = [name for name in links if name.startswith("jlv-")]
            if not leftover:
                break
            for name in leftover:
                sh("ip", "link", "del", name, check=False)
            time.sleep(0.2)
        if remove:
            shutil.rmtree(self.base, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="netlab", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["up", "down"])
    parser.add_argument("--dir", default="/tmp/judge-netlab", help="the lab's directory (default %(default)s)")
    args = parser.parse_args(argv)
    lab = Lab(Path(args.dir))
    try:
        if args.command == "up":
            info = lab.up()
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

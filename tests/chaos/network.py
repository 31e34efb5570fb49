"""The chaos run's network: every arbiter and worker on a host of its own (a network namespace joined
to this machine by a veth on one bridge), so that a partition is packets dropped on the way, both
directions or one, by nftables in that host's namespace.

This machine, at the bridge's address, runs what the faults do not cut: the database (Patroni's
PostgreSQL servers listen there too) and the fault proxies the workers reach the arbiters through,
whose history stays the record of every exchange. So a worker's link is worker <-> this machine, and
an arbiter's link to the database is the arbiter's host <-> this machine's PostgreSQL ports.

A cut drops packets silently (no RST, no ICMP), as a dead link or a firewall does: each side learns
only from its own timeouts. "inbound" drops what reaches the host (its requests arrive, the replies
do not), "outbound" what leaves it, "both" the two.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "ansible" / "lab"))
import netlab  # noqa: E402  (a script, not a package: the lab tool's own tear-down)

PREFIX = "jch-"
BRIDGE = "jch-br"
SUBNET = "10.233.0"  # the netlab's is 10.231.0, the takeover test's 10.232.x
BRIDGE_ADDRESS = f"{SUBNET}.1"
DIRECTIONS = ("both", "inbound", "outbound")


def sh(*argv: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, input=stdin)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
    return done


class Network:
    """Hosts by name, each with its namespace and address; ``cut`` and ``mend`` their links."""

    def __init__(self, names: list[str]):
        self.addresses = {name: f"{SUBNET}.{10 + index}" for index, name in enumerate(names)}
        self.cut_now: dict[str, str] = {}

    @staticmethod
    def netns(name: str) -> str:
        return PREFIX + name

    def up(self) -> "Network":
        self.down()  # what a killed run left
        sh("ip", "link", "add", BRIDGE, "type", "bridge")
        sh("ip", "addr", "add", f"{BRIDGE_ADDRESS}/24", "dev", BRIDGE)
        sh("ip", "link", "set", BRIDGE, "up")
        for index, (name, address) in enumerate(self.addresses.items()):
            ns, near = self.netns(name), f"jchv-{index}"
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", near, "type", "veth", "peer", "name", "eth0", "netns", ns)
            sh("ip", "link", "set", near, "master", BRIDGE)
            sh("ip", "link", "set", near, "up")
            for argv in (["ip", "addr", "add", f"{address}/24", "dev", "eth0"], ["ip", "link", "set", "eth0", "up"],
                         ["ip", "link", "set", "lo", "up"]):
                sh("ip", "netns", "exec", ns, *argv)
        return self

    def cut(self, name: str, direction: str, ports: list[int] | None = None) -> None:
        """Drop the host's packets to and from this machine, in ``direction``; only those of TCP
        connections with ``ports`` on this machine's side when given (the database's, say)."""
        if direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {DIRECTIONS}, not {direction!r}")
        if ports:
            listed = "{ " + ", ".join(str(p) for p in ports) + " }"
            leaving = f"ip daddr {BRIDGE_ADDRESS} tcp dport {listed}"
            arriving = f"ip saddr {BRIDGE_ADDRESS} tcp sport {listed}"
        else:
            leaving, arriving = 'oifname "eth0"', 'iifname "eth0"'
        rules = ["add table inet chaos", "flush table inet chaos",
                 "add chain inet chaos leaving { type filter hook output priority 0; }",
                 "add chain inet chaos arriving { type filter hook input priority 0; }"]
        if direction in ("both", "outbound"):
            rules.append(f"add rule inet chaos leaving {leaving} drop")
        if direction in ("both", "inbound"):
            rules.append(f"add rule inet chaos arriving {arriving} drop")
        sh("ip", "netns", "exec", self.netns(name), "nft", "-f", "-", stdin="\n".join(rules) + "\n")
        self.cut_now[name] = direction

    def mend(self, name: str) -> None:
        sh("ip", "netns", "exec", self.netns(name), "nft", "delete", "table", "inet", "chaos", check=False)
        self.cut_now.pop(name, None)

    def mend_all(self) -> None:
        for name in list(self.cut_now):
            self.mend(name)

    @staticmethod
    def down() -> None:
        """Every jch-* namespace and its processes, and the bridge (the netlab's tear-down)."""
        leftover = netlab.remove_namespaces(PREFIX, BRIDGE, "jchv-")
        if leftover:
            raise RuntimeError(f"veths of an earlier run stay: {leftover}")

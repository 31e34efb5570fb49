"""Worker configuration (TOML). Every bad or missing value is one clear error at start-up."""

from __future__ import annotations

import ipaddress
import os
import re
import ssl
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from arbiter.protocol.configfiles import ConfigError, check_dsn, is_toml_type, read_secret_file, read_toml_file
from arbiter.protocol.vocabulary import LANGUAGES, WORKER_ID
from worker.credential_file import CredentialError, check_credential
from worker.sandbox import cgroups


@dataclass(frozen=True)
class SandboxConfig:
    uid: int = 65534
    gid: int = 65534
    output_limit_kb: int = 65536
    # A program's stderr past this is OLE; only its tail is kept. Never charged as its memory.
    stderr_limit_kb: int = 8192
    max_processes: int = 64
    wall_factor: float = 3.0
    # The cgroup below which this worker's runs are made: two workers on one kernel may keep apart.
    cgroup_parent: str = cgroups.DEFAULT_PARENT


# Each daemon declares its settings in a dataclass of its own (the arbiter's: arbiter/server/config.py,
# ArbiterSettings): the two lists have the same shape (name: type = default) and share a few names
# (dsn, tls_*), but they are two programs' configs, read and checked by each alone.
@dataclass(frozen=True)
class WorkerConfig:
    worker_id: str
    kind: str
    transport: str
    outbox_dir: Path
    testdata_dir: Path
    work_dir: Path
    languages: tuple[str, ...] = LANGUAGES
    arbiter_urls: tuple[str, ...] = ()
    credential: str = ""
    # Where the credential came from: read again when it is replaced (a rotation), see credential_file.py.
    credential_file: Path | None = None
    # The CA bundle an https:// arbiter's certificate must chain to: the site's own CA ("system": the
    # machine's trust store, never implied). http:// to anything but loopback needs allow_plaintext.
    tls_ca_file: str = ""
    allow_plaintext: bool = False
    # The test-data cache (worker/judging/datastore.py): files fetched from the arbiter, by content.
    data_dir: Path | None = None
    # The cache's size: sets used longest ago are evicted beyond it (the one in use always stays).
    data_cache_max_mb: int = 10240
    dsn: str = ""
    heartbeat_interval_secs: float = 15.0
    long_poll_secs: float = 25.0
    backoff_initial_secs: float = 1.0
    backoff_max_secs: float = 30.0
    # A request that hangs this long (a paused or overloaded arbiter) fails over to the next arbiter URL.
    # Keep it well below the lease period so a hung arbiter cannot cost a worker its lease.
    request_timeout_secs: float = 10.0
    legacy_poll_secs: float = 1.0
    legacy_idle_fresh_secs: float = 5.0
    # Judge slots: concurrent judgings on this host, slot i pinned to CPU slot_cpus[i] (none pinned for
    # one slot unless slot_cpus says so). The arbiter must know the count: judgectl worker ensure --slots.
    slots: int = 1
    slot_cpus: tuple[int, ...] = ()
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)


_TOP = {"worker_id": str, "kind": str, "transport": str, "outbox_dir": str, "testdata_dir": str, "work_dir": str,
        "languages": list, "arbiter_urls": list, "credential_file": str, "dsn": str, "dsn_file": str,
        "tls_ca_file": str, "allow_plaintext": bool, "data_dir": str, "data_cache_max_mb": int,
        "heartbeat_interval_secs": float, "long_poll_secs": float, "backoff_initial_secs": float,
        "backoff_max_secs": float, "request_timeout_secs": float, "legacy_poll_secs": float,
        "legacy_idle_fresh_secs": float, "slots": int, "slot_cpus": list, "sandbox": dict}
_SANDBOX = {"uid": int, "gid": int, "output_limit_kb": int, "stderr_limit_kb": int, "max_processes": int,
            "wall_factor": float, "cgroup_parent": str}


def _check_types(section: str, raw: dict, schema: dict) -> None:
    unknown = sorted(set(raw) - set(schema))
    if unknown:
        raise ConfigError(f"unknown key(s) in {section}: {', '.join(unknown)}")
    for key, value in raw.items():
        expected = schema[key]
        if not is_toml_type(value, expected):
            raise ConfigError(f"{section}.{key} must be {expected.__name__}, got {type(value).__name__}")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_transport_security(urls, ca_file: str, allow_plaintext: bool) -> None:
    """The credential and every submission cross the network: encrypted and to the site's own
    arbiter unless the operator says otherwise in so many words."""
    for url in urls:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme == "http" and not _is_loopback(parsed.hostname or "") and not allow_plaintext:
            raise ConfigError(f"arbiter URL {url} is plain http to another host: the credential and the "
                              "submissions would cross the network in clear; use https:// (with tls_ca_file) "
                              "or set allow_plaintext = true")
        if parsed.scheme == "https" and not ca_file:
            raise ConfigError(f"arbiter URL {url} is https: set tls_ca_file to the site's CA bundle "
                              "(or \"system\" for the machine's trust store)")
    if ca_file and ca_file != "system":
        try:
            ssl.create_default_context(cafile=ca_file)
        except FileNotFoundError:
            raise ConfigError(f"tls_ca_file {ca_file} does not exist") from None
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(f"tls_ca_file {ca_file}: not a CA bundle ({getattr(exc, 'reason', None) or exc})") from None


def client_ssl_context(ca_file: str) -> ssl.SSLContext:
    """Verify the arbiter against ``ca_file`` only (or the system store for "system"); TLS 1.2+."""
    ctx = ssl.create_default_context() if ca_file == "system" else ssl.create_default_context(cafile=ca_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


MAX_SLOTS = 256


def usable_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity: a container's or systemd's CPU set included)."""
    return sorted(os.sched_getaffinity(0))


def slot_cpus_for(slots: int, given: list | None, transport: str) -> tuple[int, ...]:
    """Each slot's CPU. Given: one distinct usable CPU per slot. Not given, several slots: the last
    ``slots`` usable CPUs (the first stays for the system and the worker itself when there is one to
    spare); one slot: unpinned, as a worker always ran."""
    if not 1 <= slots <= MAX_SLOTS:
        raise ConfigError(f"slots must be between 1 and {MAX_SLOTS}")
    if slots > 1 and transport != "arbiter":
        raise ConfigError("slots > 1 needs transport 'arbiter' (the legacy scheme judges one submission "
                          "per worker)")
    usable = usable_cpus()
    if given is not None:
        if len(given) != slots or not all(isinstance(c, int) and not isinstance(c, bool) for c in given):
            raise ConfigError(f"slot_cpus must list one CPU number per slot ({slots})")
        if len(set(given)) != len(given):
            raise ConfigError("slot_cpus must not name a CPU twice: each slot has its own")
        outside = sorted(set(given) - set(usable))
        if outside:
            raise ConfigError(f"slot_cpus {outside} are not CPUs this worker may use ({_cpu_list(usable)})")
        return tuple(given)
    if slots == 1:
        return ()
    if slots > len(usable):
        raise ConfigError(f"slots = {slots} but this worker may use {len(usable)} CPU(s) ({_cpu_list(usable)}): "
                          "each slot needs its own")
    return tuple(usable[-slots:])


def _cpu_list(cpus: list[int]) -> str:
    return ",".join(str(c) for c in cpus)


def load(path: str | Path) -> WorkerConfig:
    raw = read_toml_file(path)
    _check_types("config", raw, _TOP)
    sandbox_raw = raw.pop("sandbox", {})
    _check_types("sandbox", sandbox_raw, _SANDBOX)
    for key in ("worker_id", "kind", "transport", "outbox_dir", "testdata_dir", "work_dir"):
        if not raw.get(key):
            raise ConfigError(f"config key {key!r} is required")
    if not WORKER_ID.match(raw["worker_id"]):
        raise ConfigError("worker_id must be 1-63 chars of a-z, 0-9, '_' or '-'")
    if raw["kind"] not in ("home", "production"):
        raise ConfigError("kind must be 'home' or 'production'")
    if raw["transport"] not in ("arbiter", "direct"):
        raise ConfigError("transport must be 'arbiter' or 'direct'")
    languages = tuple(raw.get("languages", LANGUAGES))
    if not languages or not set(languages) <= set(LANGUAGES):
        raise ConfigError(f"languages must be a non-empty subset of {list(LANGUAGES)}")
    values = {k: raw[k] for k in ("heartbeat_interval_secs", "long_poll_secs", "backoff_initial_secs",
                                  "backoff_max_secs", "request_timeout_secs", "legacy_poll_secs",
                                  "legacy_idle_fresh_secs") if k in raw}
    for key, value in values.items():
        if value <= 0:
            raise ConfigError(f"{key} must be > 0")
    if raw.get("data_cache_max_mb", 1) <= 0:
        raise ConfigError("data_cache_max_mb must be > 0")
    if values.get("long_poll_secs", 25) > 30:
        raise ConfigError("long_poll_secs must be at most 30 (the arbiter's long-poll limit)")
    credential = dsn = ""
    credential_file = None
    urls = tuple(raw.get("arbiter_urls", ()))
    if raw["transport"] == "arbiter":
        if not urls or not all(isinstance(u, str) and re.match(r"^https?://[^/\s]+", u) for u in urls):
            raise ConfigError("transport 'arbiter' needs arbiter_urls: a list of http(s)://host:port URLs")
        if not raw.get("credential_file"):
            raise ConfigError("transport 'arbiter' needs credential_file")
        _check_transport_security(urls, raw.get("tls_ca_file", ""), raw.get("allow_plaintext", False))
        try:
            credential = check_credential(read_secret_file(raw["credential_file"], "credential_file", ConfigError),
                                          raw["worker_id"])
        except CredentialError as exc:
            raise ConfigError(f"credential_file {exc}") from None
        credential_file = Path(raw["credential_file"])
    if raw.get("dsn") and raw.get("dsn_file"):
        raise ConfigError("give dsn or dsn_file, not both")
    if raw.get("dsn_file"):
        dsn = read_secret_file(raw["dsn_file"], "dsn_file", ConfigError)
    elif raw.get("dsn"):
        dsn = raw["dsn"]
    if raw["transport"] == "direct" and not dsn:
        raise ConfigError("transport 'direct' needs dsn or dsn_file")
    if dsn:
        check_dsn(dsn, "dsn_file" if raw.get("dsn_file") else "dsn")
    sandbox = SandboxConfig(**sandbox_raw)
    if sandbox.uid == 0 or sandbox.gid == 0:
        raise ConfigError("sandbox uid/gid must not be 0: submissions never run as root")
    for key in ("output_limit_kb", "stderr_limit_kb", "max_processes"):
        if getattr(sandbox, key) <= 0:
            raise ConfigError(f"sandbox.{key} must be > 0")
    if not cgroups.PARENT_NAME.match(sandbox.cgroup_parent):
        raise ConfigError("sandbox.cgroup_parent must be one cgroup name: 1-63 chars of A-Z, a-z, 0-9, '_', '.', '-'")
    slots = raw.get("slots", 1)
    slot_cpus = slot_cpus_for(slots, raw.get("slot_cpus"), raw["transport"])
    testdata = Path(raw["testdata_dir"])
    if not testdata.is_dir():
        raise ConfigError(f"testdata_dir {testdata} is not a directory")
    data_dir = Path(raw["data_dir"]) if raw.get("data_dir") else Path(raw["outbox_dir"]).parent / "data"
    for key, directory in (("outbox_dir", Path(raw["outbox_dir"])), ("work_dir", Path(raw["work_dir"])),
                           ("data_dir", data_dir)):
        blocker = _not_a_directory(directory)
        if blocker is not None:
            raise ConfigError(f"{key} {directory} cannot be a directory: {blocker} is a file")
    return WorkerConfig(worker_id=raw["worker_id"], kind=raw["kind"], transport=raw["transport"],
                        outbox_dir=Path(raw["outbox_dir"]), testdata_dir=testdata, work_dir=Path(raw["work_dir"]),
                        languages=languages, arbiter_urls=urls, credential=credential,
                        credential_file=credential_file, tls_ca_file=raw.get("tls_ca_file", ""),
                        allow_plaintext=raw.get("allow_plaintext", False),
                        data_dir=data_dir,
                        data_cache_max_mb=raw.get("data_cache_max_mb", 10240),
                        dsn=dsn, sandbox=sandbox, slots=slots, slot_cpus=slot_cpus,
                        **values)


def _not_a_directory(directory: Path) -> Path | None:
    """The path that keeps ``directory`` from being one (itself, or an ancestor, being something
    else than a directory), or None: it is a directory, or the worker can make it one."""
    path = directory
    while not path.exists():
        if path.parent == path:
            return None
        path = path.parent
    return None if path.is_dir() else path

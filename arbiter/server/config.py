"""Arbiter settings: a TOML file (``JUDGE_ARBITER_CONFIG``) plus a few environment overrides.

Unknown keys, wrong types and out-of-range values are refused at start-up
with one line naming the key.
"""

from __future__ import annotations

import math
import os
import ssl
from dataclasses import dataclass, fields
from pathlib import Path

from arbiter.protocol.configfiles import ConfigError, check_dsn, is_toml_type, read_secret_file, read_toml_file
from arbiter.store.canary import PROGRAMS as CANARY_PROGRAMS


@dataclass(frozen=True)
class ArbiterSettings:
    dsn: str = ""
    # Optional: where the arbiter's session-level needs go (LISTEN, the leader's advisory lock) when
    # dsn is a transaction pooler such as PgBouncer; without it everything uses dsn.
    session_dsn: str = ""
    bind: str = "127.0.0.1:8080"
    # Lease traffic on more processes (docs/decisions.md, "Lease traffic on more than one process"):
    # with lease_bind set, lease_processes processes serve heartbeats, results, releases and test
    # data there, and every grant names that port (lease_port) to its worker; the one process on
    # `bind` parks acquires and dispatches, as it does alone without lease_bind. Workers reach the
    # lease port at the host name of their arbiter URL. lease_processes: by default the CPUs this
    # process may run on, less one for the dispatching process (at least 1, at most 16).
    lease_bind: str = ""
    lease_processes: int = 1
    # HTTPS (both or neither): the server certificate (chain) and its key (mode 0600). TLS 1.2 or newer.
    tls_certfile: str = ""
    tls_keyfile: str = ""
    # lease protocol (docs/design.md section 5)
    unconfirmed_secs: float = 10.0
    lease_secs: float = 60.0
    grace_secs: float = 60.0
    max_attempts: int = 3
    # A lease handed back (release) this many times makes the submission system_error: no worker
    # could judge it (each release gives its attempt back, so max_attempts alone would not stop it).
    max_releases: int = 5
    long_poll_max_secs: float = 30.0
    # server capacity: a parked long-poll costs a socket and a few KB, no thread (arbiter/server/serving.py)
    max_parked: int = 10_000
    # One worker (one credential) may hold this many parking places; more get 429 + Retry-After, so
    # one worker cannot take the lot. A worker parks one at a time; retries take the same place.
    max_parked_per_worker: int = 4
    max_body_bytes: int = 1_048_576
    # Slow clients: a request's line and headers must arrive within header_timeout_secs of its first
    # byte (or of the connection), its body within body_timeout_secs (408); else the connection closes.
    header_timeout_secs: float = 10.0
    body_timeout_secs: float = 10.0
    # Threads that run the (short) database calls of requests; also the pool's size. Requests
    # waiting for a thread queue on the event loop, they never hold a thread while parked or stalled.
    db_threads: int = 16
    # loops
    dispatch_tick_secs: float = 1.0
    # A dispatch round leases up to this many submissions to parked requests in one statement.
    dispatch_batch_size: int = 500
    # Rounds look at the queue when told something changed (NOTIFY, a parked request, a new LISTEN
    # session); at least this often anyway, so a NOTIFY lost in transit strands work this long at most.
    dispatch_sweep_secs: float = 30.0
    # The leader lock's session is checked (and the database's health with it) this often.
    leader_check_secs: float = 5.0
    # With no arbiter lease live the janitor has nothing to reclaim: it sweeps this often (and at
    # once when a lease is granted) instead of every janitor_interval_secs.
    janitor_idle_secs: float = 10.0
    janitor_interval_secs: float = 1.0
    # A janitor that has not swept for this long (DB time) was absent itself: paused, starved or
    # stopped. Its absence is not the workers' fault, so a grace period comes before any reclaim.
    absence_grace_after_secs: float = 5.0
    leader_retry_secs: float = 3.0
    # An acquire at an arbiter that does not lead waits this long for the lock to come (a hand-over
    # in progress) before it is turned away to the next URL.
    handover_wait_secs: float = 1.0
    leader_lock_key: int = 0x4A554447  # "JUDG"
    ready_max_round_age_secs: float = 5.0
    stuck_alert_secs: float = 30.0
    # Stages 1-3: the legacy yield rules. A legacy node counts as idle if it polled this recently
    # (the legacy workers' own rule), and work waits for a legacy worker's turn this long at most.
    legacy_fresh_secs: float = 5.0
    legacy_yield_secs: float = 2.0
    # The standing end-to-end probe (leader only): an unpinned canary every this many seconds, one
    # open at a time (0 turns it off); decided canaries are forgotten after canary_keep_secs, except
    # each worker's last one. canary_language: the program judged (a language every site judges).
    canary_interval_secs: float = 60.0
    canary_language: str = "c"
    canary_keep_secs: float = 86400.0
    db_timeout_secs: float = 3.0
    # A verified credential is used this long at most, while the process hears judgectl's changes
    # (arbiter/server/credential_cache.py): a revocation through judgectl is heard at once.
    credential_cache_secs: float = 300.0
    # Python's full garbage collection runs this often in each serving process instead of when its
    # own rule says (0: Python's rule); see arbiter/server/gcpolicy.py.
    gc_full_collection_secs: float = 300.0
    instance_name: str = ""
    # Who may read /metrics, /v1/status and /status: with no token, loopback clients only; with one
    # (from operator_token_file, mode 0600), anyone presenting it (Bearer, or Basic's password).
    operator_token: str = ""

    def __repr__(self) -> str:  # never a secret in a log line or a traceback
        return "ArbiterSettings(...)"


_ENV_OVERRIDES = {"JUDGE_DSN": "dsn", "JUDGE_ARBITER_BIND": "bind"}
# Keys that meant something once: refused with what replaced them, not just "unknown".
_REMOVED_KEYS = {
    "reserved_threads": "parked requests and slow clients no longer hold threads (asyncio serving); "
                        "remove it (db_threads sizes the threads for database calls)",
}


def _coerce(name: str, expected: type, value):
    if not is_toml_type(value, expected):
        raise ConfigError(f"config key {name!r} must be {expected.__name__}, got {type(value).__name__}")
    return float(value) if expected is float else value


def load_settings(path: str | os.PathLike | None = None, **overrides) -> ArbiterSettings:
    path = path or os.environ.get("JUDGE_ARBITER_CONFIG")
    raw: dict = {}
    if path:
        raw = read_toml_file(path)
    for file_key, key in (("dsn_file", "dsn"), ("session_dsn_file", "session_dsn")):
        dsn_file = raw.pop(file_key, None)
        if dsn_file:
            try:
                raw[key] = Path(dsn_file).read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise ConfigError(f"{file_key} {dsn_file}: {exc.strerror}") from None
    token_file = raw.pop("operator_token_file", None)
    if token_file:
        raw["operator_token"] = read_secret_file(token_file, "operator_token_file")
        if len(raw["operator_token"]) < 16:
            raise ConfigError(f"operator_token_file {token_file} holds fewer than 16 characters")
    for env, key in _ENV_OVERRIDES.items():
        if os.environ.get(env):
            raw[key] = os.environ[env]
    raw.update(overrides)
    for key in sorted(set(raw) & set(_REMOVED_KEYS)):
        raise ConfigError(f"config key {key!r} was removed: {_REMOVED_KEYS[key]}")
    known = {f.name: f.type for f in fields(ArbiterSettings)}
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ConfigError(f"unknown config key(s): {', '.join(unknown)}")
    types = {"str": str, "float": float, "int": int}
    values = {k: _coerce(k, types[known[k]], v) for k, v in raw.items()}
    if "lease_processes" not in values:
        values["lease_processes"] = default_lease_processes()
    settings = ArbiterSettings(**values)
    if not settings.dsn:
        raise ConfigError("no database configured: set 'dsn' (or 'dsn_file') in the config file or JUDGE_DSN")
    check_dsn(settings.dsn, "dsn")
    if settings.session_dsn:
        check_dsn(settings.session_dsn, "session_dsn")
    positive = ["unconfirmed_secs", "lease_secs", "grace_secs", "long_poll_max_secs", "dispatch_tick_secs",
                "janitor_interval_secs", "absence_grace_after_secs", "leader_retry_secs", "ready_max_round_age_secs",
                "stuck_alert_secs", "db_timeout_secs", "max_attempts", "max_releases", "max_parked", "max_parked_per_worker",
                "max_body_bytes", "legacy_fresh_secs", "header_timeout_secs", "body_timeout_secs", "db_threads",
                "dispatch_batch_size", "dispatch_sweep_secs", "leader_check_secs", "janitor_idle_secs"]
    for key in positive:
        if getattr(settings, key) <= 0:
            raise ConfigError(f"config key {key!r} must be > 0")
    if settings.canary_interval_secs < 0:
        raise ConfigError("config key 'canary_interval_secs' must be >= 0 (0: no standing canary probe)")
    if settings.canary_keep_secs <= 0:
        raise ConfigError("config key 'canary_keep_secs' must be > 0")
    if settings.canary_language not in CANARY_PROGRAMS:
        raise ConfigError(f"config key 'canary_language' must be one of {', '.join(sorted(CANARY_PROGRAMS))}")
    if not 0 <= settings.credential_cache_secs < math.inf:
        raise ConfigError("config key 'credential_cache_secs' must be a number >= 0 (0: no credential is cached)")
    if not 0 <= settings.gc_full_collection_secs < math.inf:
        raise ConfigError("config key 'gc_full_collection_secs' must be a number >= 0 (0: Python's own rule)")
    if settings.legacy_yield_secs < 0:
        raise ConfigError("config key 'legacy_yield_secs' must be >= 0 (0: never wait for a legacy worker's turn)")
    if not 0 <= settings.handover_wait_secs < math.inf:
        raise ConfigError("config key 'handover_wait_secs' must be a number >= 0 (0: a standby turns an acquire "
                          "away at once)")
    if settings.unconfirmed_secs > settings.lease_secs:
        raise ConfigError("unconfirmed_secs must not exceed lease_secs")
    _check_lease_bind(settings)
    _check_tls(settings)
    return settings


MAX_LEASE_PROCESSES = 16


def default_lease_processes() -> int:
    """One lease-serving process per CPU this process may use, less the dispatching process's."""
    return max(1, min(MAX_LEASE_PROCESSES, len(os.sched_getaffinity(0)) - 1))


def bind_port(bind: str) -> int | None:
    """The port of a ``host:port`` bind (``[v6]:port`` too); None if it names none."""
    host, sep, port = bind.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return int(port)


def _check_lease_bind(settings: ArbiterSettings) -> None:
    if not 1 <= settings.lease_processes <= MAX_LEASE_PROCESSES:
        raise ConfigError(f"config key 'lease_processes' must be 1..{MAX_LEASE_PROCESSES}")
    if not settings.lease_bind:
        return
    port = bind_port(settings.lease_bind)
    if port is None:
        raise ConfigError(f"config key 'lease_bind' must be host:port (a TCP port 1-65535), "
                          f"got {settings.lease_bind!r}")
    if settings.lease_bind == settings.bind or port == bind_port(settings.bind):
        raise ConfigError("config key 'lease_bind' must name a port other than bind's: the two are served by "
                          "different processes")


def server_ssl_context(certfile: str, keyfile: str) -> ssl.SSLContext:
    """What the arbiter serves HTTPS with: TLS 1.2 or newer, the certificate and key given."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(certfile, keyfile)
    return ctx


def _check_tls(settings: ArbiterSettings) -> None:
    """One line at start-up for a certificate or key that would only fail at the first handshake."""
    if bool(settings.tls_certfile) != bool(settings.tls_keyfile):
        raise ConfigError("tls_certfile and tls_keyfile go together: set both for HTTPS, or neither")
    if not settings.tls_certfile:
        return
    read_secret_file(settings.tls_keyfile, "tls_keyfile")  # exists, not empty, not readable by others
    try:
        server_ssl_context(settings.tls_certfile, settings.tls_keyfile)
    except FileNotFoundError as exc:
        raise ConfigError(f"tls_certfile {settings.tls_certfile}: {exc.strerror}") from None
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"tls_certfile/tls_keyfile: not a certificate and its key "
                          f"({getattr(exc, 'reason', None) or exc})") from None

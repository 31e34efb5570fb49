"""HTTPS between workers and the arbiter: the site's own CA, TLS 1.2 or newer, no plaintext to a remote
host unless asked for in so many words, and clear one-line errors for broken TLS settings."""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys

import pytest
from support.procs import aplusb_site, wait_for
from support.programs import PROGRAMS

from arbiter.ctl import tlsfiles
from arbiter.server.config import ConfigError, load_settings
from arbiter.store import leases
from worker import config as worker_config
from worker.delivery.http_client import ArbiterClient, Unreachable

FAST = {"heartbeat_interval_secs": 1.0, "long_poll_secs": 2.0, "backoff_initial_secs": 0.2, "backoff_max_secs": 1.0}


@pytest.fixture
def pki(tmp_path):
    """The site's CA with the arbiter's certificate for 127.0.0.1, and a stranger's CA."""
    site_ca, _ = tlsfiles.ensure_ca(tmp_path / "ca")
    cert, key, _ = tlsfiles.issue_server_cert(tmp_path / "ca", tmp_path / "arbiter", ["127.0.0.1", "localhost"])
    other_ca, _ = tlsfiles.ensure_ca(tmp_path / "other-ca")
    return {"ca": str(site_ca), "cert": str(cert), "key": str(key), "other_ca": str(other_ca)}


def judged(db) -> dict:
    with db.connect() as conn:
        return dict(conn.execute("SELECT status, count(*) FROM submissions GROUP BY 1").fetchall())


def test_a_worker_judges_over_https_and_refuses_a_server_its_ca_did_not_sign(db, arbiters, workers, tmp_path, pki):
    site = aplusb_site(db, tmp_path)
    a = arbiters.start(db.dsn, ca_file=pki["ca"], tls_certfile=pki["cert"], tls_keyfile=pki["key"])
    assert a.url.startswith("https://")
    # An impostor's certificate (another CA) for the same address: the worker never sends it a request.
    cautious = workers("home-1", "home", "arbiter", site.testdata, arbiter_urls=[a.url], credential=site.cred,
                       tls_ca_file=pki["other_ca"], **FAST).start()
    with db.connect() as conn:
        sids = [leases.submit(conn, site.user, site.problem, "python3", PROGRAMS["python3"]["AC"]) for _ in range(3)]
    wait_for(lambda: "CERTIFICATE_VERIFY_FAILED" in cautious.log_text(), 30, interval=0.2,
             what="the worker to refuse the certificate")
    assert judged(db) == {"pending": 3}
    assert not _acquires(a), "a request got past the handshake"
    cautious.stop()

    workers("home-1", "home", "arbiter", site.testdata, arbiter_urls=[a.url], credential=site.cred,
            tls_ca_file=pki["ca"], **FAST).start()
    wait_for(lambda: judged(db) == {"AC": 3}, 60, interval=0.2, what="judging over https")
    with db.connect() as conn:
        tokens = conn.execute("SELECT count(*) FROM submission_judgings WHERE lease_token IS NOT NULL "
                              "AND submission_id = ANY(%s)", (sids,)).fetchone()[0]
    assert tokens == 3


def _acquires(a) -> bool:
    status, text = a.get("/metrics")
    assert status == 200
    return any(line.startswith("arbiter_requests_total{") and 'route="/v1/acquire"' in line
               for line in text.splitlines())


def test_the_arbiter_refuses_tls_below_1_2_and_plain_http(db, arbiters, tmp_path, pki):
    aplusb_site(db, tmp_path)
    a = arbiters.start(db.dsn, ca_file=pki["ca"], tls_certfile=pki["cert"], tls_keyfile=pki["key"])
    old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    old.load_verify_locations(pki["ca"])
    old.minimum_version = old.maximum_version = ssl.TLSVersion.TLSv1_1
    old.set_ciphers("DEFAULT:@SECLEVEL=0")  # this client would speak TLS 1.1: the server must not
    with socket.create_connection(("127.0.0.1", a.port), timeout=5) as raw:
        with pytest.raises(ssl.SSLError):
            old.wrap_socket(raw, server_hostname="127.0.0.1")
    modern = ssl.create_default_context(cafile=pki["ca"])
    with socket.create_connection(("127.0.0.1", a.port), timeout=5) as raw:
        with modern.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            assert tls.version() in ("TLSv1.2", "TLSv1.3")
    # Plain HTTP on the TLS port gets no answer as HTTP (the handshake fails; nothing is served in clear).
    with pytest.raises(Unreachable):
        ArbiterClient([a.url.replace("https://", "http://")], "home-1.x", timeout=3).acquire("r", None, 0)
    assert a.get("/readyz")[0] == 200


def _worker_toml(tmp_path, **extra) -> str:
    (tmp_path / "td").mkdir(exist_ok=True)
    cred = tmp_path / "cred"
    cred.write_text("home-1.secret\n")
    cred.chmod(0o600)
    lines = ['worker_id = "home-1"', 'kind = "home"', 'transport = "arbiter"', f'outbox_dir = "{tmp_path}/ob"',
             f'testdata_dir = "{tmp_path}/td"', f'work_dir = "{tmp_path}/w"', f'credential_file = "{cred}"']
    for key, value in extra.items():
        lines.append(f"{key} = " + (f'"{value}"' if isinstance(value, str) else str(value).lower()
                                    if isinstance(value, bool) else repr(value)))
    path = tmp_path / "worker.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.mark.parametrize("extra, error", [
    ({"arbiter_urls": ["http://10.0.0.5:8080"]}, "plain http to another host"),
    ({"arbiter_urls": ["http://arbiter.example:8080"]}, "plain http to another host"),
    ({"arbiter_urls": ["https://arbiter.example:8443"]}, "set tls_ca_file"),
    ({"arbiter_urls": ["https://arbiter.example:8443"], "tls_ca_file": "/nonexistent/ca.crt"}, "does not exist"),
    ({"arbiter_urls": ["https://arbiter.example:8443"], "tls_ca_file": "BADFILE"}, "not a CA bundle"),
    ({"arbiter_urls": ["http://10.0.0.5:8080"], "allow_plaintext": "yes"}, "allow_plaintext must be bool"),
])
def test_worker_config_refuses_plaintext_to_a_remote_host_and_broken_tls(tmp_path, extra, error):
    if extra.get("tls_ca_file") == "BADFILE":
        bad = tmp_path / "bad.crt"
        bad.write_text("not a certificate\n")
        extra = dict(extra, tls_ca_file=str(bad))
    with pytest.raises(worker_config.ConfigError, match=error):
        worker_config.load(_worker_toml(tmp_path, **extra))


def test_worker_config_accepts_loopback_plaintext_and_an_explicit_choice(tmp_path, pki):
    for extra in ({"arbiter_urls": ["http://127.0.0.1:8080"]}, {"arbiter_urls": ["http://[::1]:8080"]},
                  {"arbiter_urls": ["http://localhost:8080"]},
                  {"arbiter_urls": ["http://10.0.0.5:8080"], "allow_plaintext": True},
                  {"arbiter_urls": ["https://10.0.0.5:8443"], "tls_ca_file": pki["ca"]},
                  {"arbiter_urls": ["https://arbiter.example:8443"], "tls_ca_file": "system"}):
        cfg = worker_config.load(_worker_toml(tmp_path, **extra))
        assert cfg.arbiter_urls == tuple(extra["arbiter_urls"])


def test_arbiter_tls_settings_are_checked_at_start_up(tmp_path, pki):
    base = {"dsn": "host=/nonexistent"}
    with pytest.raises(ConfigError, match="go together"):
        load_settings(None, **base, tls_certfile=pki["cert"])
    loose = tmp_path / "loose.key"
    loose.write_bytes(open(pki["key"], "rb").read())
    loose.chmod(0o644)
    with pytest.raises(ConfigError, match="readable by group/others"):
        load_settings(None, **base, tls_certfile=pki["cert"], tls_keyfile=str(loose))
    with pytest.raises(ConfigError, match="tls_certfile /nonexistent"):
        load_settings(None, **base, tls_certfile="/nonexistent", tls_keyfile=pki["key"])
    other_key = tmp_path / "other"
    _, wrong_key, _ = tlsfiles.issue_server_cert(tmp_path / "ca", other_key, ["10.9.9.9"])
    with pytest.raises(ConfigError, match="not a certificate and its key"):
        load_settings(None, **base, tls_certfile=pki["cert"], tls_keyfile=str(wrong_key))
    assert load_settings(None, **base, tls_certfile=pki["cert"], tls_keyfile=pki["key"]).tls_certfile == pki["cert"]
    # The gunicorn master refuses the same at start: one line, exit 2.
    env_conf = tmp_path / "bad.toml"
    env_conf.write_text(f'dsn = "host=/nonexistent"\ntls_certfile = "{pki["cert"]}"\n')
    result = subprocess.run([sys.executable, "-m", "gunicorn", "-c", "arbiter/server/gunicorn.conf.py", "arbiter.server.asgi:app"],
                            cwd=_repo(), env={"JUDGE_ARBITER_CONFIG": str(env_conf), "PATH": "/usr/bin:/bin"},
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "go together" in result.stderr


def _repo():
    from pathlib import Path

    return Path(__file__).resolve().parents[1]


def test_tlsfiles_keeps_what_is_good_and_renews_what_is_not(tmp_path):
    ca, created = tlsfiles.ensure_ca(tmp_path / "ca")
    assert created and oct((tmp_path / "ca" / "ca.key").stat().st_mode & 0o777) == "0o600"
    assert tlsfiles.ensure_ca(tmp_path / "ca") == (ca, False)
    cert, key, issued = tlsfiles.issue_server_cert(tmp_path / "ca", tmp_path / "srv", ["arbiter.example", "10.0.0.1"])
    assert issued and oct(key.stat().st_mode & 0o777) == "0o600"
    first = cert.read_bytes()
    assert tlsfiles.issue_server_cert(tmp_path / "ca", tmp_path / "srv", ["arbiter.example"])[2] is False
    # a name it does not cover, a certificate about to expire, another CA: issued again
    assert tlsfiles.issue_server_cert(tmp_path / "ca", tmp_path / "srv", ["other.example"])[2] is True
    assert tlsfiles.issue_server_cert(tmp_path / "ca", tmp_path / "srv", ["other.example"], renew_days=400)[2] is True
    tlsfiles.ensure_ca(tmp_path / "ca2")
    assert tlsfiles.issue_server_cert(tmp_path / "ca2", tmp_path / "srv", ["other.example"])[2] is True
    assert cert.read_bytes() != first


def test_tlsfiles_request_and_sign_keep_the_key_on_its_host(tmp_path):
    """The Ansible flow: the key is made where it is used; only a CSR and a certificate travel."""
    tlsfiles.ensure_ca(tmp_path / "ca")
    host = tmp_path / "host"
    csr = tlsfiles.request(host, tmp_path / "ca" / "ca.crt", ["10.0.0.20", "arbiter-1"])
    assert csr.startswith(b"-----BEGIN CERTIFICATE REQUEST-----")
    key = (host / "server.key").read_bytes()
    assert oct((host / "server.key").stat().st_mode & 0o777) == "0o600" and b"PRIVATE KEY" not in csr
    cert = tlsfiles.sign(tmp_path / "ca", csr, ["10.0.0.20", "arbiter-1"])
    (host / "server.crt").write_bytes(cert)
    assert tlsfiles.request(host, tmp_path / "ca" / "ca.crt", ["10.0.0.20", "arbiter-1"]) is None
    # Renewal: the same key, a new request.
    assert tlsfiles.request(host, tmp_path / "ca" / "ca.crt", ["10.0.0.20"], renew_days=500) is not None
    assert (host / "server.key").read_bytes() == key
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(host / "server.crt", host / "server.key")  # the certificate is on that key
    with pytest.raises(ValueError):
        tlsfiles.sign(tmp_path / "ca", b"garbage", ["x"])

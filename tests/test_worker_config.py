"""Bad worker configuration is one clear error line at start-up and exit status 2."""

import json
import subprocess
import sys

import pytest

from worker import config


def write(tmp_path, text, cred_mode=0o600):
    (tmp_path / "td").mkdir(exist_ok=True)
    cred = tmp_path / "cred"
    cred.write_text("home-1.secret\n")
    cred.chmod(cred_mode)
    path = tmp_path / "w.toml"
    path.write_text(text.format(td=tmp_path / "td", cred=cred, out=tmp_path / "out", work=tmp_path / "work"))
    return path


GOOD = '''worker_id = "home-1"
kind = "home"
transport = "arbiter"
arbiter_urls = ["http://127.0.0.1:8080"]
credential_file = "{cred}"
outbox_dir = "{out}"
testdata_dir = "{td}"
work_dir = "{work}"
'''


def test_good_config_loads(tmp_path):
    cfg = config.load(write(tmp_path, GOOD))
    assert cfg.credential == "home-1.secret" and cfg.arbiter_urls == ("http://127.0.0.1:8080",)


@pytest.mark.parametrize("change,message", [
    (lambda t: t.replace('kind = "home"', 'kind = "laptop"'), "kind must be 'home' or 'production'"),
    (lambda t: t.replace('transport = "arbiter"', 'transport = "carrier-pigeon"'), "transport must be"),
    (lambda t: t.replace('arbiter_urls = ["http://127.0.0.1:8080"]', 'arbiter_urls = ["ftp://x"]'), "arbiter_urls"),
    (lambda t: t + 'long_poll_secs = "ten"\n', "long_poll_secs must be float"),
    (lambda t: t + 'long_poll_secs = 99\n', "at most 30"),
    (lambda t: t + 'colour = "blue"\n', "unknown key(s) in config: colour"),
    (lambda t: t + '[sandbox]\nuid = 0\n', "must not be 0"),
    (lambda t: t + '[sandbox]\ncgroup_parent = "../escape"\n', "sandbox.cgroup_parent must be one cgroup name"),
    (lambda t: t.replace('worker_id = "home-1"', 'worker_id = "Home 1"'), "worker_id must be"),
    (lambda t: t.replace('worker_id = "home-1"', 'worker_id = "home-2"'), "credential for another worker"),
    (lambda t: t.replace('testdata_dir = "{td}"', 'testdata_dir = "/nonexistent"'), "is not a directory"),
    # Directories the worker makes: a file in the way is refused at start-up, not met mid-judging.
    (lambda t: t + 'data_dir = "/etc/hostname"\n', "data_dir /etc/hostname cannot be a directory: /etc/hostname is a file"),
    (lambda t: t + 'data_dir = "/etc/hostname/cache"\n', "cannot be a directory: /etc/hostname is a file"),
    (lambda t: t.replace('work_dir = "{work}"', 'work_dir = "/etc/hostname/work"'), "work_dir /etc/hostname/work cannot"),
    (lambda t: t.replace('outbox_dir = "{out}"', 'outbox_dir = "/etc/hostname"'), "outbox_dir /etc/hostname cannot"),
    (lambda t: t.replace('transport = "arbiter"', 'transport = "direct"'), "needs dsn"),
    (lambda t: "worker_id = [", "not valid TOML"),
])
def test_bad_config_is_one_clear_error(tmp_path, change, message):
    path = write(tmp_path, change(GOOD))
    with pytest.raises(config.ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        config.load(path)


def test_world_readable_credential_is_refused(tmp_path):
    with pytest.raises(config.ConfigError, match="readable by group/others"):
        config.load(write(tmp_path, GOOD, cred_mode=0o644))


def test_cli_exits_2_with_one_line(tmp_path):
    path = write(tmp_path, GOOD.replace('kind = "home"', 'kind = "laptop"'))
    result = subprocess.run([sys.executable, "-m", "worker.main", "--config", str(path)], capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 2
    assert result.stderr == "judge-worker: config error: kind must be 'home' or 'production'\n"
    missing = subprocess.run([sys.executable, "-m", "worker.main", "--config", str(tmp_path / "nope.toml")],
                             capture_output=True, text=True, timeout=30)
    assert missing.returncode == 2 and "does not exist" in missing.stderr


@pytest.mark.parametrize("make,message", [
    (lambda p: p.mkdir(), "Is a directory"),
    (lambda p: p.write_bytes(b'worker_id = "\xff"\n'), "is not UTF-8 text"),
], ids=["a-directory", "not-utf8"])
def test_a_config_file_that_cannot_be_read_is_one_line(tmp_path, make, message):
    """Both daemons read their config file through the seam (arbiter.protocol.configfiles), so each
    way a file can fail to be read is the same one line for the arbiter and the worker."""
    from arbiter.server.config import load_settings

    path = tmp_path / "judge.toml"
    make(path)
    for load in (config.load, load_settings):
        with pytest.raises(config.ConfigError, match=message):
            load(path)


@pytest.mark.parametrize("dsn,message", [
    ("host=db-1,db-2 port=5432,5432 dbname=judge", "names 2 hosts: add target_session_attrs=read-write"),
    ("postgresql://db-1:5432,db-2:5432,db-3:5432/judge", "names 3 hosts: add target_session_attrs=read-write"),
    ("host=db-1,db-2 dbname=judge target_session_attrs=any", "names 2 hosts"),
    ("host=db-1 password='hunter2", "is not a valid libpq connection string"),
], ids=["two-hosts", "url-three-hosts", "any-session", "unparsable"])
def test_a_dsn_that_cannot_follow_the_primary_is_refused_by_each_client(tmp_path, monkeypatch, dsn, message):
    """A replicated database's DSN names every host and asks for the writable one; without
    target_session_attrs libpq keeps whichever host answers first, a standby after a failover. The
    arbiter, the direct-DB worker and judgectl refuse it at start-up, in one line, never echoing
    the string (it may hold a password)."""
    from arbiter.ctl.common import CtlError
    from arbiter.ctl.common import connect as ctl_connect
    from arbiter.server.config import load_settings

    monkeypatch.delenv("JUDGE_ARBITER_CONFIG", raising=False)
    monkeypatch.delenv("JUDGE_DSN", raising=False)
    with pytest.raises(config.ConfigError, match=message) as refused:
        load_settings(None, dsn=dsn)
    assert "hunter2" not in str(refused.value)
    path = write(tmp_path, GOOD.replace('transport = "arbiter"', 'transport = "direct"') + f"dsn = {json.dumps(dsn)}\n")
    with pytest.raises(config.ConfigError, match=message):
        config.load(path)
    with pytest.raises(CtlError, match=message):
        ctl_connect(dsn)


def test_a_multi_host_dsn_that_asks_for_the_primary_is_accepted(tmp_path, monkeypatch):
    from arbiter.server.config import load_settings

    monkeypatch.delenv("JUDGE_ARBITER_CONFIG", raising=False)
    dsn = "host=db-1,db-2 port=5432,5432 dbname=judge target_session_attrs=read-write"
    assert load_settings(None, dsn=dsn).dsn == dsn
    path = write(tmp_path, GOOD.replace('transport = "arbiter"', 'transport = "direct"') + f"dsn = {json.dumps(dsn)}\n")
    assert config.load(path).dsn == dsn

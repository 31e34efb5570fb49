"""Bad worker configuration is one clear error line at start-up and exit status 2."""

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


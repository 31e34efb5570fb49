"""gunicorn settings for the arbiter (used by ``judge-arbiter`` and the systemd unit).

One worker process: parked requests and the dispatcher live in that process's
memory, and only one arbiter dispatches at a time anyway (leader lock).
Threads = max_parked + reserved_threads, and the dispatcher refuses to park
more than max_parked, so heartbeats and results always find a free thread.
"""

import os
import sys

from arbiter.config import ConfigError, load_settings

try:
    _settings = load_settings()
except ConfigError as exc:
    sys.stderr.write(f"judge-arbiter: config error: {exc}\n")
    sys.exit(2)

bind = [_settings.bind]
workers = 1
worker_class = "gthread"
threads = _settings.threads
# Long-polls last up to long_poll_max_secs; the gthread worker notifies the master from its main loop.
timeout = int(max(60, _settings.long_poll_max_secs * 2))
graceful_timeout = int(_settings.long_poll_max_secs + 5)
keepalive = 75
accesslog = None  # the app logs every request as JSON
errorlog = "-"
loglevel = os.environ.get("JUDGE_ARBITER_LOGLEVEL", "info")
proc_name = f"judge-arbiter{('-' + _settings.instance_name) if _settings.instance_name else ''}"
limit_request_field_size = 8190


def worker_exit(server, worker):
    # Release the leader lock and close connections promptly on a clean stop.
    wsgi = sys.modules.get("arbiter.wsgi")
    if wsgi is not None:
        wsgi.runtime.stop()

"""gunicorn settings for the arbiter (used by ``judge-arbiter`` and the systemd unit).

One worker process: parked requests and the dispatcher live in that process's
memory, and only one arbiter dispatches at a time anyway (leader lock). It serves
on an asyncio loop (arbiter/server/serving.py): a parked long-poll or a slow client costs
a socket, not a thread; the dispatcher refuses to park more than max_parked.
"""

import os
import sys

from arbiter.server.config import ConfigError, load_settings
from arbiter.server.serving import WORKER_CLASS

try:
    _settings = load_settings()
except ConfigError as exc:
    sys.stderr.write(f"judge-arbiter: config error: {exc}\n")
    sys.exit(2)

bind = [_settings.bind]
if _settings.tls_certfile:
    # HTTPS: the worker class (arbiter/server/serving.py) holds the context to TLS 1.2 or newer.
    certfile, keyfile = _settings.tls_certfile, _settings.tls_keyfile
workers = 1
worker_class = WORKER_CLASS
# The worker's loop notifies the master every tick; a worker silent this long is hung.
timeout = 60
# A stop answers parked long-polls at once; this bounds the requests in flight.
graceful_timeout = 10
keepalive = 75
# gunicorn 25.1+ opens a control socket for gunicornc at one path per user (~/.gunicorn/gunicorn.ctl):
# nothing here uses it, every arbiter on a host would take it from the one before, and it is one more
# way into a running process.
control_socket_disable = True
accesslog = None  # the app logs every request as JSON
errorlog = "-"
loglevel = os.environ.get("JUDGE_ARBITER_LOGLEVEL", "info")
proc_name = f"judge-arbiter{('-' + _settings.instance_name) if _settings.instance_name else ''}"

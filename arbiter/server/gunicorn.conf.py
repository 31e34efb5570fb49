"""gunicorn settings for the arbiter (used by ``judge-arbiter`` and the systemd unit).

One process parks requests and dispatches (they live in its memory, and only one arbiter
dispatches at a time anyway: the leader lock); with ``lease_bind`` set, ``lease_processes`` more
serve lease traffic on that address (arbiter/server/roles.py). Each serves on an asyncio loop
(arbiter/server/serving.py): a parked long-poll or a slow client costs a socket, not a thread; the
dispatcher refuses to park more than max_parked.
"""

import os
import shutil
import sys

from arbiter.server import roles
from arbiter.server.config import ConfigError, load_settings
from arbiter.server.metrics import counter_dir, make_counter_dir
from arbiter.server.serving import WORKER_CLASS

try:
    _settings = load_settings()
except ConfigError as exc:
    sys.stderr.write(f"judge-arbiter: config error: {exc}\n")
    sys.exit(2)

bind = roles.binds(_settings)
if _settings.tls_certfile:
    # HTTPS: the worker class (arbiter/server/serving.py) holds the context to TLS 1.2 or newer.
    certfile, keyfile = _settings.tls_certfile, _settings.tls_keyfile
workers = roles.worker_count(_settings)
if _settings.lease_bind:
    # Where the lease processes leave their counters for /metrics (arbiter/server/metrics.py); made
    # once per master, removed when it exits.
    make_counter_dir()
pre_fork = roles.assign
on_reload = roles.on_reload


def on_exit(server):
    directory = counter_dir(made_by=os.getpid())
    if directory:
        shutil.rmtree(directory, ignore_errors=True)


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

"""ASGI entry point for gunicorn: ``arbiter.server.asgi:app``, served by ``arbiter.server.serving.ArbiterWorker``
(one process per role, see arbiter/server/roles.py and gunicorn.conf.py)."""

from __future__ import annotations

import os

from arbiter.protocol import logs
from arbiter.server import roles
from arbiter.server.config import load_settings
from arbiter.server.gcpolicy import CollectionPolicy
from arbiter.server.http.app import create_asgi, create_lease_asgi
from arbiter.server.metrics import CounterFiles, counter_dir
from arbiter.server.runtime import LeaseRuntime, Runtime

# The same variable sets gunicorn's own log level (gunicorn.conf.py).
logs.configure(os.environ.get("JUDGE_ARBITER_LOGLEVEL", "info").upper())
settings = load_settings()
_counter_dir = counter_dir()
counters = CounterFiles(_counter_dir) if _counter_dir else None
if roles.current_role() == roles.LEASE:
    runtime = LeaseRuntime(settings, publisher=counters).start()
    app = create_lease_asgi(runtime)
else:
    runtime = Runtime(settings, counters=counters).start()
    app = create_asgi(runtime)
    # The listening socket is gunicorn's and already bound; from here on requests are served.
    runtime.notifier.ready("serving")
# Last: what is loaded by now is frozen, never walked by a garbage collection again.
collection_policy = CollectionPolicy(roles.current_role(), settings.gc_full_collection_secs).install()

"""ASGI entry point for gunicorn: ``arbiter.server.asgi:app``, served by ``arbiter.server.serving.ArbiterWorker``
(one worker process; see gunicorn.conf.py)."""

from __future__ import annotations

import os

from arbiter.protocol import logs
from arbiter.server.config import load_settings
from arbiter.server.http.app import create_asgi
from arbiter.server.runtime import Runtime

# The same variable sets gunicorn's own log level (gunicorn.conf.py).
logs.configure(os.environ.get("JUDGE_ARBITER_LOGLEVEL", "info").upper())
settings = load_settings()
runtime = Runtime(settings).start()
app = create_asgi(runtime)
# The listening socket is gunicorn's and already bound; from here on requests are served.
runtime.notifier.ready("serving")

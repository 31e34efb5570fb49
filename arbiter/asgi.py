"""ASGI entry point for gunicorn: ``arbiter.asgi:app``, served by ``arbiter.serving.ArbiterWorker``
(one worker process; see gunicorn.conf.py)."""

from __future__ import annotations

import os

from . import logs
from .app import create_asgi
from .config import load_settings
from .runtime import Runtime

# The same variable sets gunicorn's own log level (gunicorn.conf.py).
logs.configure(os.environ.get("JUDGE_ARBITER_LOGLEVEL", "info").upper())
settings = load_settings()
runtime = Runtime(settings).start()
app = create_asgi(runtime)
# The listening socket is gunicorn's and already bound; from here on requests are served.
runtime.notifier.ready("serving")

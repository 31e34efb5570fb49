"""ASGI entry point for gunicorn: ``arbiter.asgi:app``, served by ``arbiter.serving.ArbiterWorker``
(one worker process; see gunicorn.conf.py)."""

from __future__ import annotations

from . import logs
from .app import create_asgi
from .config import load_settings
from .runtime import Runtime

logs.configure()
settings = load_settings()
runtime = Runtime(settings).start()
app = create_asgi(runtime)
# The listening socket is gunicorn's and already bound; from here on requests are served.
runtime.notifier.ready("serving")

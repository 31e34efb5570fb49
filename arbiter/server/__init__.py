"""The arbiter process: what gunicorn runs (serving, the ASGI app, the runtime and its loops,
metrics, settings). judge-arbiter starts it (cli.py with gunicorn.conf.py)."""

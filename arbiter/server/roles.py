"""Which process of one arbiter's gunicorn serves what (docs/decisions.md, "Lease traffic on more than
one process").

Without ``lease_bind`` there is one process: it parks acquires, dispatches, and serves everything.
With it, the master runs ``1 + lease_processes`` processes in two roles:

- ``dispatch``: exactly one. Serves ``bind`` (every route): the parked acquires, the dispatcher,
  the leader lock and the leader's loops live in its memory, as before.
- ``lease``: the others. Serve ``lease_bind`` only, and on it only what needs no parked state:
  heartbeats, results, releases, test data (arbiter/server/http/app.py LEASE_ROUTES). Every such
  request is one fenced statement, so any number of processes may answer them side by side.

The master gives each new process its role before it forks it (``assign``): ``dispatch`` when no
process it keeps has that role (at start, after the dispatching process died, and after a reload,
whose old processes are on their way out), ``lease`` otherwise. A process that dies is replaced
in its role; connections meanwhile wait in the listening socket's backlog, which the master holds.
"""

from __future__ import annotations

import os

DISPATCH, LEASE = "dispatch", "lease"
# What a worker process reads to know its role (set by ArbiterWorker before it loads the app).
ROLE_ENV = "JUDGE_ARBITER_ROLE"
_ROLE_ATTR = "judge_arbiter_role"
_RETIRING_ATTR = "judge_arbiter_retiring"


def worker_count(settings) -> int:
    """gunicorn's ``workers``."""
    return 1 + settings.lease_processes if settings.lease_bind else 1


def binds(settings) -> list[str]:
    """gunicorn's ``bind``, the dispatching process's address first (``sockets_for`` relies on it)."""
    return [settings.bind, settings.lease_bind] if settings.lease_bind else [settings.bind]


def on_reload(server) -> None:
    """gunicorn's on_reload hook (SIGHUP): the processes running now are all replaced, the dispatching
    one included; the first new process must take its role, though the old one still runs."""
    setattr(server, _RETIRING_ATTR, set(server.WORKERS))


def assign(server, worker) -> None:
    """gunicorn's pre_fork hook: the role of the process about to be forked."""
    retiring = getattr(server, _RETIRING_ATTR, set())
    kept = [w for pid, w in server.WORKERS.items() if pid not in retiring]
    has_dispatch = any(getattr(w, _ROLE_ATTR, None) == DISPATCH for w in kept)
    setattr(worker, _ROLE_ATTR, LEASE if has_dispatch else DISPATCH)


def role_of(worker) -> str:
    """A gunicorn worker's role (``dispatch`` for a worker no hook saw: the single-process case)."""
    return getattr(worker, _ROLE_ATTR, DISPATCH)


def sockets_for(role: str, sockets: list) -> list:
    """The listening sockets a process of ``role`` serves, of those gunicorn opened in ``binds`` order."""
    if len(sockets) < 2:
        return sockets
    return sockets[:1] if role == DISPATCH else sockets[1:]


def current_role() -> str:
    """This process's role, for the app it loads (arbiter/server/asgi.py)."""
    role = os.environ.get(ROLE_ENV, DISPATCH)
    return role if role in (DISPATCH, LEASE) else DISPATCH

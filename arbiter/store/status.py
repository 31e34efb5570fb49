"""What the status endpoints and `judgectl status` report about the queue, at a cost that follows
the live work, not the history (a site with ten years of submissions answers as fast as a new one)."""

from __future__ import annotations

from arbiter.store import leases
from arbiter.store.sqlfiles import Statements

OPS = Statements("operator.sql")


def queue(cur) -> dict:
    """Live work exactly (pending, judging), everything decided as an estimate. ``cur`` returns dicts.

    Open canaries are counted apart: they are nobody's work.
    """
    live = {r["status"]: r["count"] for r in cur.execute(OPS.status_queue).fetchall()}
    canaries = live.pop("canaries")
    total = cur.execute(OPS.status_rows_estimate).fetchone()["estimate"]
    return {"queue": live, "canaries_open": canaries,
            "decided_estimate": max(total - sum(live.values()) - canaries, 0)}


WORKER_STATES = ("busy", "idle", "silent", "paused", "revoked")


def workers_of(cur) -> list[dict]:
    """Every registered worker, one row each; on the stage-4 schema also whether it is paused."""
    pauses = leases.worker_pauses_present(cur.connection)
    rows = cur.execute(OPS.status_workers_with_pauses if pauses else OPS.status_workers).fetchall()
    for row in rows:
        row.setdefault("paused", False)
        row.setdefault("paused_reason", None)
    return rows


def queue_gauges(cur) -> dict:
    """What /metrics reads from the database at each scrape: live work by status, the oldest
    never-decided pending submission's age (partial indexes) and the workers by state (one row each)."""
    live = {r["status"]: r["count"] for r in cur.execute(OPS.status_queue).fetchall()}
    counts = dict.fromkeys(WORKER_STATES, 0)
    for row in workers_of(cur):
        counts[worker_state(row)] += 1
    return {"queue": live, "oldest_pending_secs": cur.execute(OPS.oldest_pending_age).fetchone()["age_s"],
            "workers": counts}


# A worker not heard from for this long is "silent": two of its long-polls (25 s each, the worker's
# default) without a word.
SILENT_AFTER_SECS = 60.0


def worker_state(row: dict) -> str:
    """busy (holds leases), idle (heard from lately), silent, paused (by the operator: granted
    nothing new, whatever it holds) or revoked: as judgectl and /status say."""
    if row["revoked"]:
        return "revoked"
    if row["paused"]:
        return "paused"
    if row["leases"]:
        return "busy"
    seen = row["last_seen_ago_s"]
    return "idle" if seen is not None and seen <= SILENT_AFTER_SECS else "silent"


def snapshot(cur) -> dict:
    """The queue, the leases in flight, the workers and each worker's last canary, as the status
    endpoints and judgectl show them."""
    rows = workers_of(cur)
    for row in rows:
        row["state"] = worker_state(row)
    return {**queue(cur), "leases": cur.execute(OPS.status_leases).fetchall(), "workers": rows,
            "last_canaries": cur.execute(OPS.status_last_canaries).fetchall()}


def contest_view(cur) -> dict:
    """What the status page adds for contest day: the oldest waiting age, decisions per minute over
    the last hour, the recent system_errors (each O(recent work))."""
    return {"oldest_pending_secs": cur.execute(OPS.oldest_pending_age).fetchone()["age_s"],
            "verdicts_last_hour": cur.execute(OPS.status_verdicts_last_hour).fetchall(),
            "recent_system_errors": cur.execute(OPS.status_recent_system_errors).fetchall()}

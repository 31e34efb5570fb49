"""A small Prometheus text-format registry (counters and gauges with labels)."""

from __future__ import annotations

import threading

_HELP = {
    "arbiter_parked_requests": ("gauge", "Acquire requests parked right now"),
    "arbiter_slot_parked_requests": ("gauge", "Acquire requests parked right now per worker and judge slot (workers with several "
                                     "slots): 1 is a slot waiting for work, 0 a slot judging (or gone)"),
    "arbiter_dispatch_rounds_total": ("counter", "Dispatch rounds completed"),
    "arbiter_dispatch_batches_total": ("counter", "acquire_leases statements run (batch dispatch, stage 4 and fresh sites)"),
    "arbiter_slow_clients_closed_total": ("counter", "Connections closed for a slow or oversized request, by phase"),
    "arbiter_notifications_total": ("counter", "NOTIFY messages received"),
    "arbiter_leases_granted_total": ("counter", "Leases granted, by worker kind"),
    "arbiter_leases_reclaimed_total": ("counter", "Expired leases reclaimed, by outcome"),
    "arbiter_grace_periods_total": ("counter", "Grace periods granted"),
    "arbiter_legacy_turns_total": ("counter", "Matches deferred to a legacy worker's turn (stages 1-3)"),
    "arbiter_requests_total": ("counter", "HTTP requests answered, by route and status"),
    "arbiter_results_total": ("counter", "Results received, by outcome"),
    "arbiter_results_refused_total": ("counter", "Results refused for a reason no retry fixes (a 4xx other than 401, 408, "
                                      "410, 429), by status: the verdict waits in the worker's outbox/rejected/ "
                                      "(413: the worker sends it again without its detail)"),
    "arbiter_heartbeats_total": ("counter", "Heartbeats received, by outcome"),
    "arbiter_releases_total": ("counter", "Leases handed back by their workers, by outcome"),
    "arbiter_is_leader": ("gauge", "1 while this arbiter holds the leader lock"),
    "arbiter_db_up": ("gauge", "1 while the database answers"),
    "arbiter_last_round_age_seconds": ("gauge", "Seconds since the last completed dispatch round"),
    "arbiter_stuck_dispatch": ("gauge", "1 while claimable work and a parked request coexist unmatched too long"),
    "arbiter_oldest_unmatched_seconds": ("gauge", "Age of the oldest parked request that has claimable work"),
    "arbiter_canary_interval_seconds": ("gauge", "The standing canary probe's interval (0: probe off)"),
    "arbiter_canary_last_success_timestamp_seconds": ("gauge",
                                                      "When (DB time, Unix seconds) a probe canary last got its "
                                                      "expected verdict (if none ever: when probing began)"),
    "arbiter_canary_duration_seconds": ("gauge", "Submitted-to-decided time of the last decided probe canary"),
    "arbiter_canaries_total": ("counter", "Probe canaries decided, by outcome (as_expected, unexpected)"),
    "arbiter_canaries_forgotten_total": ("counter", "Old decided canaries cleaned up"),
}


def _escape(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    """Full precision (a Unix timestamp keeps its fraction), integers without a trailing .0."""
    value = float(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


class Metrics:
    def __init__(self):
        self._lock = threading.Lock()
        self._values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    def inc(self, name: str, amount: float = 1, **labels) -> None:
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            self._values[key] = self._values.get(key, 0) + amount

    def set_gauge(self, name: str, value: float, **labels) -> None:
        with self._lock:
            self._values[(name, tuple(sorted(labels.items())))] = value

    def get(self, name: str, **labels) -> float:
        with self._lock:
            return self._values.get((name, tuple(sorted(labels.items()))), 0)

    def render(self) -> str:
        with self._lock:
            items = sorted(self._values.items())
        lines: list[str] = []
        seen: set[str] = set()
        for (name, labels), value in items:
            if name not in seen:
                kind, text = _HELP.get(name, ("untyped", name))
                lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
                seen.add(name)
            label_text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
            text = _number(value)
            lines.append(f"{name}{{{label_text}}} {text}" if label_text else f"{name} {text}")
        return "\n".join(lines) + "\n"


METRICS = Metrics()

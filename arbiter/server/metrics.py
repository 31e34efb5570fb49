"""A small Prometheus text-format registry (counters, gauges and histograms with labels).

With lease processes (arbiter/server/roles.py) each process counts its own requests: a lease process
writes its counters and histograms to a file of its own in a directory the gunicorn master made
(``CounterFiles``, once a second and when it stops), and the dispatching process's /metrics adds
every file to its own. A file outlives its process, so a lease process that restarts does not set
its counters back (its successor writes a file of its own). Gauges stay each process's own: the
ones /metrics shows are the dispatching process's.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
from pathlib import Path

log = logging.getLogger("arbiter.metrics")

_HELP = {
    "arbiter_parked_requests": ("gauge", "Acquire requests parked right now"),
    "arbiter_slot_parked_requests": ("gauge", "Acquire requests parked right now per worker and judge slot (workers with several "
                                     "slots): 1 is a slot waiting for work, 0 a slot judging (or gone)"),
    "arbiter_dispatch_rounds_total": ("counter", "Dispatch rounds completed"),
    "arbiter_dispatch_looks_total": ("counter", "Dispatch rounds' looks at the queue, by look: full (claimable_work counts "
                                     "every pending row); pins or known: the work known from the last look covered "
                                     "every parked request, and only the pinned canaries were read (a NOTIFY said "
                                     "one came) or nothing"),
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
    "arbiter_group_commit_batches_total": ("counter", "Statements that wrote a batch of heartbeats or results (group "
                                           "commit), by kind: writes / batches is the mean batch"),
    "arbiter_group_commit_writes_total": ("counter", "Heartbeats or results written in batches, by kind"),
    "arbiter_group_commit_split_total": ("counter", "Batches that failed as one statement and were written again one "
                                         "write at a time (a deadlock broken, a value refused), by kind"),
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
    "arbiter_verdicts_total": ("counter", "Verdicts recorded from workers (repeats not counted), by verdict and worker"),
    "arbiter_system_errors_total": ("counter", "Submissions that ended system_error, by cause: attempts (its lease ran "
                                    "out max_attempts times), releases (handed back max_releases times), worker "
                                    "(a worker's own verdict)"),
    "arbiter_gc_pause_seconds": ("histogram", "Python's garbage collections and how long each stood the serving "
                                 "process's event loop still, by role and generation (2: the full collection, "
                                 "every gc_full_collection_secs)"),
    "arbiter_gc_collected_objects_total": ("counter", "Objects in reference cycles freed by garbage collections, by "
                                           "role and generation (requests leave none: a rise is a regression)"),
    "arbiter_judging_seconds": ("histogram", "From a lease's grant to its result (DB time), by worker kind"),
    "arbiter_queue_wait_seconds": ("histogram", "From submission to its first lease (DB time), by worker kind"),
    "arbiter_queue_submissions": ("gauge", "Submissions by live status (pending, judging; canaries apart), read from "
                                  "the database at each scrape"),
    "arbiter_oldest_pending_seconds": ("gauge", "Age of the oldest pending submission that has never been decided "
                                       "(0 when none), read from the database at each scrape"),
    "arbiter_workers": ("gauge", "Registered workers by state (busy: holds leases; idle: heard from within 60 s; "
                        "silent; paused by the operator; revoked), read from the database at each scrape"),
}

# Buckets (seconds) of both histograms: from a 50 ms judgement or a parked worker's instant grant to a
# contest backlog of an hour.
SECONDS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)


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
        self._histogram_keys: dict[tuple, tuple[list, tuple, tuple]] = {}

    def inc(self, name: str, amount: float = 1, **labels) -> None:
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            self._values[key] = self._values.get(key, 0) + amount

    def observe(self, name: str, value: float, buckets=SECONDS_BUCKETS, **labels) -> None:
        """One observation of a histogram: its cumulative buckets, sum and count."""
        base = tuple(sorted(labels.items()))
        with self._lock:
            keys = self._histogram_keys.get((name, base, buckets))
            if keys is None:
                keys = self._histogram_keys[(name, base, buckets)] = self._new_histogram(name, base, buckets)
            bucket_keys, sum_key, count_key = keys
            for bound, key in zip(buckets, bucket_keys):
                if value <= bound:
                    self._values[key] += 1
            self._values[bucket_keys[-1]] += 1  # +Inf
            self._values[sum_key] += value
            self._values[count_key] += 1

    def _new_histogram(self, name: str, base: tuple, buckets) -> tuple[list, tuple, tuple]:
        """A histogram's sample keys, each at 0 (every bucket shows from the first observation on).
        Made once per label set: an observation then sorts no labels (one per result received)."""
        bucket_keys = [(name + "_bucket", tuple(sorted((*base, ("le", _number(bound)))))) for bound in buckets]
        bucket_keys.append((name + "_bucket", tuple(sorted((*base, ("le", "+Inf"))))))
        sum_key, count_key = (name + "_sum", base), (name + "_count", base)
        for key in (*bucket_keys, sum_key, count_key):
            self._values.setdefault(key, 0)
        return bucket_keys, sum_key, count_key

    def set_gauge(self, name: str, value: float, **labels) -> None:
        with self._lock:
            self._values[(name, tuple(sorted(labels.items())))] = value

    def get(self, name: str, **labels) -> float:
        with self._lock:
            return self._values.get((name, tuple(sorted(labels.items()))), 0)

    def counts(self) -> list[tuple[str, list[list[str]], float]]:
        """The counters' and histograms' samples (what sums over processes), as JSON can hold them."""
        with self._lock:
            items = list(self._values.items())
        return [(name, [list(pair) for pair in labels], value) for (name, labels), value in items
                if _HELP.get(_family(name), ("",))[0] in ("counter", "histogram")]

    def render(self, others: list | None = None) -> str:
        """The text format; ``others``: other processes' ``counts()``, added to this one's."""
        with self._lock:
            values = dict(self._values)
        for name, labels, value in others or ():
            key = (name, tuple(tuple(pair) for pair in labels))
            values[key] = values.get(key, 0) + value
        items = sorted(values.items())
        lines: list[str] = []
        seen: set[str] = set()
        for (name, labels), value in _histogram_order(items):
            family = _family(name)
            if family not in seen:
                kind, text = _HELP.get(family, ("untyped", family))
                lines += [f"# HELP {family} {text}", f"# TYPE {family} {kind}"]
                seen.add(family)
            label_text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
            text = _number(value)
            lines.append(f"{name}{{{label_text}}} {text}" if label_text else f"{name} {text}")
        # Every family this arbiter can export is declared from the start, with no sample until it
        # has one (a verdict, a first lease): dashboards and rules can be checked against the list.
        for family in sorted(set(_HELP) - seen):
            kind, text = _HELP[family]
            lines += [f"# HELP {family} {text}", f"# TYPE {family} {kind}"]
        return "\n".join(lines) + "\n"


def _family(name: str) -> str:
    """A histogram's samples (_bucket, _sum, _count) belong to the family its HELP and TYPE name."""
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and _HELP.get(name[:-len(suffix)], ("",))[0] == "histogram":
            return name[:-len(suffix)]
    return name


def _bound(labels) -> float:
    le = dict(labels).get("le")
    return float("inf") if le in (None, "+Inf") else float(le)


def _histogram_order(items):
    """Samples sorted by family, then labels, with each histogram's buckets in ascending ``le`` (as
    Prometheus expects them), then its sum and count."""
    def key(item):
        (name, labels), _ = item
        family = _family(name)
        rest = tuple((k, v) for k, v in labels if k != "le")
        part = {"_bucket": 0, "_sum": 1, "_count": 2}.get(name[len(family):], 0)
        return family, rest, part, _bound(labels)
    return sorted(items, key=key)


METRICS = Metrics()

# The gunicorn master puts the directory for CounterFiles here as "<its pid>:<path>"
# (arbiter/server/gunicorn.conf.py); its processes inherit it.
COUNTER_DIR_ENV = "JUDGE_ARBITER_COUNTER_DIR"


def counter_dir(made_by: int | None = None) -> str | None:
    """The directory for CounterFiles named in COUNTER_DIR_ENV, or None; with ``made_by``, only if
    that process made it (a master's own, not one inherited from the process that started it)."""
    owner, _, directory = os.environ.get(COUNTER_DIR_ENV, "").partition(":")
    if not directory or (made_by is not None and owner != str(made_by)):
        return None
    return directory


def make_counter_dir() -> str:
    """This process's directory for CounterFiles, made once (gunicorn reads its config again on a
    reload) and named in COUNTER_DIR_ENV for the processes it starts."""
    directory = counter_dir(made_by=os.getpid())
    if directory is None:
        directory = tempfile.mkdtemp(prefix="judge-arbiter-counters-")
        os.environ[COUNTER_DIR_ENV] = f"{os.getpid()}:{directory}"
    return directory


class CounterFiles:
    """Counters across a gunicorn master's processes: one JSON file per lease process."""

    def __init__(self, directory: str | os.PathLike, metrics: Metrics = METRICS):
        self.directory = Path(directory)
        self.metrics = metrics
        self._own = self.directory / f"{os.getpid()}.json"
        self._lock = threading.Lock()

    def publish(self) -> None:
        """This process's counts, replacing its file whole (a reader never sees half of one)."""
        data = json.dumps(self.metrics.counts())
        with self._lock:
            partial = self._own.with_suffix(".partial")
            try:
                partial.write_text(data, encoding="utf-8")
                partial.replace(self._own)
            except OSError as exc:
                log.warning("cannot write this process's counters", extra={"error": str(exc)})

    def others(self) -> list:
        """Every lease process's counts, living or gone."""
        out: list = []
        for path in sorted(self.directory.glob("*.json")):
            try:
                out.extend(json.loads(path.read_text(encoding="utf-8")))
            except (OSError, ValueError):
                continue  # removed meanwhile, or a file that is not ours
        return out

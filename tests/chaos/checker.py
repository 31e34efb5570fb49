"""The chaos run's checker: reads the database and the recorded history, reports every violation.

Inputs are facts, never the system's own opinion of itself:
- the client's record of what it submitted and which verdict each program must get;
- the database at the end (submissions, append-only judging history, lease grants, passes, XP);
- lease_gen samples taken during the run;
- the proxies' history of every exchange (who asked what, when, and what came back);
- the nemesis log: which fault hit which part, from when to when.

The properties (docs/design.md sections 1, 3, 5, 6 and the issue's list):
  lost / not terminal, a result acknowledged (200) that the final database does not have, wrong verdict, verdict by a token that was not current, a generation decided
  twice, two live leases at once, lease_gen going backwards, AC/XP credited twice, a reclaim (and so
  any system_error) for which no fault on the holder's side accounts (arbiter downtime alone, or a
  jump of any process's wall clock: ``clock_jump`` is in neither set below), a lease lost to a fault
  of the holder's disk other than by its own hand-back;
and in the logs of every arbiter and worker (``log_violations``): a traceback, a line that is not one
JSON object (but for gunicorn's own start-up lines), a lease token or a worker's credential.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

# Faults on a worker's own path: the worker process, or its network to the arbiters. (An arbiter cut
# off from the database, partition_db, is arbiter downtime: it may cost a lease nothing.)
WORKER_SIDE = {"kill_worker", "pause_worker", "drop_reply", "delay_request", "stale_result",
               "stale_heartbeat", "stale_release", "stall_reply", "partition_worker", "power_loss"}
# A reply lost or stalled on the way back, of a request that reached the arbiter at once: a heartbeat
# has extended the lease, a result is written. The worker must take a missing reply for what it is
# (try again) and not for a lost lease; only an acquire's reply may cost one (the grant arrives too
# late, or never, and its unconfirmed lease runs out).
REPLY_ONLY = {"drop_reply", "stall_reply"}


def may_cost_a_lease(fault: "Fault") -> bool:
    if fault.kind not in WORKER_SIDE:
        return False
    return fault.kind not in REPLY_ONLY or fault.detail.startswith("/v1/acquire")
# Faults of a worker host's own disk (its outbox full or read-only): they may cost a lease only as a
# hand-back (the worker releases it, answered 200), never as an expiry.
LOCAL_DISK = {"disk_full", "disk_readonly"}
# Slack for comparing this host's wall clock (history) with the database's now(): same machine, same clock.
CLOCK_SLACK_SECS = 0.05
# An acquire the worker sent before its fault can stay parked at the arbiter after it (the arbiter only
# learns that nobody listens when it answers): a lease granted into that void up to the long-poll limit
# after a worker-side fault is that fault's cost, one unconfirmed period. run.py passes its limit.
ORPHANED_POLL_SECS = 3.0


@dataclass
class Fault:
    kind: str
    target: str  # worker id, arbiter name or "db"
    started_at: float
    ended_at: float
    detail: str = ""


@dataclass
class Report:
    violations: list[str] = field(default_factory=list)
    figures: dict = field(default_factory=dict)

    def add(self, kind: str, message: str) -> None:
        self.violations.append(f"{kind}: {message}")

    @property
    def ok(self) -> bool:
        return not self.violations


def check(conn, submitted: dict[int, str], gen_samples: list[tuple[int, int]], history, faults: list[Fault],
          xp_reward: int) -> Report:
    report = Report()
    rows = {sid: (status, gen) for sid, status, gen in
            conn.execute("SELECT id, status, lease_gen FROM submissions").fetchall()}
    grants = defaultdict(list)  # submission -> [(gen, worker, granted_at, token)]
    token_gen = {}
    for sid, gen, worker, granted_at, token in conn.execute(
            "SELECT submission_id, lease_gen, worker_id, extract(epoch FROM granted_at)::float8, lease_token::text "
            "FROM lease_grants ORDER BY submission_id, lease_gen").fetchall():
        grants[sid].append((gen, worker, granted_at, token))
        token_gen[token] = (sid, gen)
    judgings = defaultdict(list)  # submission -> [(seq, verdict, gen, token, decided_by, at)]
    for sid, seq, verdict, gen, token, decided_by, at in conn.execute(
            "SELECT submission_id, seq, verdict, lease_gen, lease_token::text, decided_by, "
            "extract(epoch FROM created_at)::float8 FROM submission_judgings ORDER BY submission_id, seq").fetchall():
        judgings[sid].append((seq, verdict, gen, token, decided_by, at))

    # Lost, not terminal, wrong verdict.
    for sid, expected in submitted.items():
        if sid not in rows:
            report.add("lost", f"submission {sid} is not in the database")
            continue
        status = rows[sid][0]
        if status in ("pending", "judging"):
            report.add("not terminal", f"submission {sid} is still {status}")
        elif status != expected and status != "system_error":
            report.add("wrong verdict", f"submission {sid} is {status}, its program must get {expected}")

    # Verdicts: each by the lease current when it was written, each generation decided once.
    for sid, entries in judgings.items():
        seen_gens = set()
        last_gen = 0
        for seq, verdict, gen, token, decided_by, at in entries:
            if gen < last_gen:
                report.add("lease_gen backwards", f"submission {sid} history seq {seq} has gen {gen} after {last_gen}")
            last_gen = max(last_gen, gen)
            if decided_by != "worker":
                continue
            if gen in seen_gens:
                report.add("decided twice", f"submission {sid} generation {gen} has two worker verdicts")
            seen_gens.add(gen)
            if token_gen.get(token) != (sid, gen):
                report.add("stale token", f"submission {sid} verdict {verdict} names a token no grant of gen {gen} issued")
                continue
            # Both times are the database's now(), i.e. the start of each transaction. A newer generation can
            # only be granted once this verdict (and a rejudge) committed, so it starts later; only a newer
            # grant that started before this verdict's transaction means the verdict was written too late.
            newer = [g for g in grants[sid] if g[0] > gen and g[2] + CLOCK_SLACK_SECS < at]
            if newer:
                report.add("stale token", f"submission {sid} verdict by gen {gen} written after gen {newer[0][0]} was granted")

    # Grants: generations strictly increase with time; the sampled lease_gen never went backwards.
    for sid, entries in grants.items():
        for (g1, _, t1, _), (g2, _, t2, _) in zip(entries, entries[1:]):
            if not (g2 > g1 and t2 + CLOCK_SLACK_SECS >= t1):
                report.add("lease_gen backwards", f"submission {sid} grant gen {g2} at {t2} after gen {g1} at {t1}")
    highest: dict[int, int] = {}
    for sid, gen in gen_samples:
        if gen < highest.get(sid, 0):
            report.add("lease_gen backwards", f"submission {sid} observed gen {gen} after {highest[sid]}")
        highest[sid] = max(highest.get(sid, 0), gen)

    honoured = live_lease_violations(report, history, grants, token_gen, judgings)
    acknowledged_results_lost(report, history, judgings)

    # AC and XP exactly once per (user, problem).
    passes = conn.execute("SELECT user_id, problem_id, count(*) FROM first_passes GROUP BY 1, 2").fetchall()
    for user, problem, count in passes:
        if count != 1:
            report.add("AC credited twice", f"user {user} problem {problem} has {count} first passes")
    # Each problem a user ever passed earns its reward once (every problem of the run rewards the same).
    problems_passed = defaultdict(int)
    for user, _problem in conn.execute(
            "SELECT DISTINCT s.user_id, s.problem_id FROM submission_judgings j JOIN submissions s "
            "ON s.id = j.submission_id WHERE j.verdict = 'AC'").fetchall():
        problems_passed[user] += 1
    for user, xp in conn.execute("SELECT id, xp FROM users").fetchall():
        expected_xp = xp_reward * problems_passed[user]
        if xp != expected_xp:
            report.add("XP wrong", f"user {user} has {xp} XP, expected {expected_xp}")

    reclaims, handed_back_for_disk = lost_lease_violations(report, grants, judgings, rows, faults, history,
                                                           token_gen)

    # Leases lost (a generation superseded without a verdict of its own), then judged by a later one.
    lost_then_judged = 0
    for sid, entries in grants.items():
        decided = sorted(e[2] for e in judgings[sid] if e[4] == "worker")
        lost = [gen for gen, *_ in entries[:-1] if gen not in decided]
        if lost and decided and decided[-1] > min(lost):
            lost_then_judged += 1

    counts: dict[str, int] = defaultdict(int)
    for status, _ in rows.values():
        counts[status] += 1
    report.figures.update(submissions=len(submitted), statuses=dict(sorted(counts.items())),
                          grants=sum(len(v) for v in grants.values()), reclaims=reclaims,
                          handed_back_for_disk=handed_back_for_disk, lost_then_judged=lost_then_judged,
                          honoured_token_requests=honoured, exchanges=len(history), gen_samples=len(gen_samples))
    return report


def live_lease_violations(report: Report, history, grants, token_gen, judgings) -> int:
    """Two live leases at once: an old token was honoured (heartbeat or result 200) after a newer
    generation of the same submission had been granted. The server cannot act on a request before the
    proxy sent it on (after any delay or hold), so a grant older than that is proof. Returns how many
    exchanges were honoured.

    A result repeated by the worker's outbox (its first reply was dropped) is answered as the first
    time, writing nothing: honouring it is no live lease if the verdict it repeats was written before
    the newer generation was granted (a verdict written after that is a "stale token" in check())."""
    decided_at = {(sid, gen): at for sid, entries in judgings.items()
                  for _, _, gen, _, decided_by, at in entries if decided_by == "worker"}
    honoured = 0
    for exchange in history:
        if exchange.status != 200 or not exchange.body or "lease_token" not in exchange.body:
            continue
        owner = token_gen.get(exchange.body["lease_token"])
        if owner is None:
            report.add("unknown token honoured", f"{exchange.path} by {exchange.worker_id}")
            continue
        honoured += 1
        sid, gen = owner
        reached_server = exchange.forwarded_at or exchange.sent_at
        for newer_gen, worker, granted_at, _ in grants[sid]:
            if newer_gen > gen and granted_at + CLOCK_SLACK_SECS < reached_server:
                if exchange.path.endswith("/result") and decided_at.get((sid, gen), granted_at) < granted_at:
                    continue  # the repeat of a verdict written while this generation was current
                report.add("two live leases", f"submission {sid}: gen {gen} honoured on {exchange.path} after gen "
                                              f"{newer_gen} went to {worker}")
    return honoured


def acknowledged_results_lost(report: Report, history, judgings) -> None:
    """A result the arbiter answered 200 for is in the final database's judging history (its
    token's verdict, written by the worker). A database failover may cost time, never that: the
    primary acknowledges a commit only once the synchronous standby has it (RPO 0)."""
    kept = {token for entries in judgings.values() for _, _, _, token, decided_by, _ in entries
            if decided_by == "worker"}
    for exchange in history:
        if (exchange.path.endswith("/result") and exchange.status == 200 and exchange.body
                and exchange.body.get("lease_token") not in kept):
            report.add("acknowledged result lost", f"{exchange.path} by {exchange.worker_id} was answered 200 "
                                                   f"at {exchange.replied_at:.3f}; the database has no verdict of that lease")


def lost_lease_violations(report: Report, grants, judgings, rows, faults: list[Fault], history,
                          token_gen) -> tuple[int, int]:
    """Reclaims: a generation superseded (or ended in system_error) without a verdict of its own lost
    its lease. Only a fault on the holder's side may account for that; arbiter or DB downtime may not,
    and a fault of the holder's disk only if the holder handed the lease back itself (or sent the
    hand-back and the arbiter could not take it). Returns how many
    leases were lost, and how many of them were handed back for a disk fault."""
    reclaims = handed_back_for_disk = 0
    worker_faults = defaultdict(list)
    disk_faults = defaultdict(list)
    for fault in faults:
        if may_cost_a_lease(fault):
            worker_faults[fault.target].append(fault)
        elif fault.kind in LOCAL_DISK:
            disk_faults[fault.target].append(fault)
    releases = [e for e in history if e.path.endswith("/release") and e.body and e.body.get("lease_token") in token_gen]
    handed_back = {token_gen[e.body["lease_token"]] for e in releases if e.status == 200}
    # A hand-back the worker sent that the arbiter could not take (503: its database away at that
    # moment): the worker did all it could; the lease runs out by itself, as docs/protocol.md says.
    tried = {token_gen[e.body["lease_token"]] for e in releases}
    for sid, entries in grants.items():
        decided_gens = {e[2] for e in judgings[sid] if e[4] == "worker"}
        status, current_gen = rows.get(sid, (None, None))
        for index, (gen, worker, granted_at, _) in enumerate(entries):
            superseded_at = entries[index + 1][2] if index + 1 < len(entries) else None
            lost = gen not in decided_gens and (superseded_at is not None or
                                                (status == "system_error" and gen == current_gen))
            if not lost:
                continue
            reclaims += 1
            until = superseded_at if superseded_at is not None else float("inf")

            def during(held_faults, until=until, granted_at=granted_at) -> bool:
                return any(f.started_at <= until and f.ended_at >= granted_at - ORPHANED_POLL_SECS - CLOCK_SLACK_SECS
                           for f in held_faults)

            if not during(worker_faults[worker]):
                if during(disk_faults[worker]):
                    if (sid, gen) in handed_back:
                        handed_back_for_disk += 1  # its disk failed it and it said so: the lease went back at once
                        continue
                    if (sid, gen) in tried:
                        continue  # it said so, and the arbiter could not take the lease back then
                    report.add("lease lost to a disk fault", f"submission {sid} gen {gen} held by {worker} from "
                                                             f"{granted_at:.3f} was lost while {worker}'s disk failed, "
                                                             "without its hand-back")
                    continue
                kind = "system_error from arbiter downtime" if superseded_at is None else "unaccounted reclaim"
                report.add(kind, f"submission {sid} gen {gen} held by {worker} from {granted_at:.3f} was reclaimed "
                                 f"with no fault on {worker}'s side")
    return reclaims, handed_back_for_disk


# gunicorn's own lines before our logging takes over: "[2026-12-07 09:13:41 +0000] [11467] [INFO] ...".
GUNICORN_INFO = re.compile(r"^\[[^]]+\] \[\d+\] \[INFO\] ")


def log_violations(report: Report, logs: list[Path], secrets: list[str]) -> int:
    """Every line of the processes' logs: one JSON object (gunicorn's start-up INFO lines aside), no
    traceback (a fault is met by a handled, named outcome, never by an exception that escaped), and no
    secret (lease tokens in either spelling, credentials). Returns how many lines were read."""
    spellings = {s for secret in secrets if secret for s in (secret, secret.replace("-", ""))}
    lengths = sorted({len(s) for s in spellings})
    # Tokens (UUIDs) and credentials are long runs of these characters; each run of a line is looked
    # up by its every substring of a secret's length (a set lookup each: thousands of secrets stay cheap).
    candidates = re.compile(r"[0-9A-Za-z_\-]{%d,}" % (lengths[0] if lengths else 1))

    def holds_secret(line: str) -> bool:
        return any(run[i:i + n] in spellings for run in candidates.findall(line) for n in lengths
                   for i in range(len(run) - n + 1))
    lines = 0
    for path in logs:
        with open(path, errors="replace") as log:
            for number, line in enumerate(log, 1):
                lines += 1
                folder = path.parent.name + "/" if path.parent.name.startswith("worker-") else ""
                where = f"{folder}{path.name}:{number}"
                if "Traceback" in line:
                    report.add("traceback in a log", f"{where}: {line.strip()[:200]}")
                if spellings and holds_secret(line):
                    report.add("secret in a log", f"{where}: a lease token or a credential")
                if GUNICORN_INFO.match(line):
                    continue
                try:
                    parsed = json.loads(line)
                except ValueError:
                    parsed = None
                if not isinstance(parsed, dict):
                    report.add("unstructured log line", f"{where}: {line.strip()[:200]}")
    return lines

"""The arbiter's read-only status page for contest day (server-rendered HTML with an inline SVG chart,
no script; it reloads itself every 5 s)."""

from __future__ import annotations

from html import escape

CHART_WIDTH, CHART_HEIGHT, MINUTES = 600, 80, 60


def _cell(value) -> str:
    if isinstance(value, bool):
        value = "yes" if value else "no"
    return escape("-" if value is None else str(value))


def _table(table_id: str, headers: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{_cell(c)}</td>" for c in row) + "</tr>" for row in rows)
    empty = f'<tr><td colspan="{len(headers)}">(none)</td></tr>'
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{body or empty}</tbody></table>'


def _age(secs: float | None) -> str:
    if secs is None:
        return "never"
    secs = float(secs)
    if secs < 120:
        return f"{secs:.0f} s"
    if secs < 7200:
        return f"{secs / 60:.0f} min"
    return f"{secs / 3600:.1f} h"


def per_minute(verdicts_last_hour: list[dict]) -> list[int]:
    """Decisions in each of the last 60 minutes, oldest first (index 59 is the current minute)."""
    counts = [0] * MINUTES
    for row in verdicts_last_hour:
        if 0 <= row["minutes_ago"] < MINUTES:
            counts[MINUTES - 1 - row["minutes_ago"]] += row["count"]
    return counts


def chart(counts: list[int]) -> str:
    """Decisions per minute as bars, an hour wide, each with its count as a tooltip."""
    top = max(counts) or 1
    width = CHART_WIDTH / len(counts)
    bars = []
    for index, count in enumerate(counts):
        height = round(count / top * (CHART_HEIGHT - 12), 1)
        ago = len(counts) - 1 - index
        bars.append(f'<rect class="bar" data-count="{count}" x="{index * width:.1f}" y="{CHART_HEIGHT - height:.1f}" '
                    f'width="{width - 1:.1f}" height="{height}"><title>{count} decided, {ago} min ago</title></rect>')
    return (f'<svg id="per-minute" role="img" aria-label="decisions per minute over the last hour" '
            f'width="{CHART_WIDTH}" height="{CHART_HEIGHT}" viewBox="0 0 {CHART_WIDTH} {CHART_HEIGHT}">'
            f'<text x="2" y="10" font-size="10">max {top}/min</text>{"".join(bars)}</svg>')


def render(snapshot: dict) -> str:
    arbiter = snapshot["arbiter"]
    state = "ready" if arbiter["ready"] else "NOT READY: " + "; ".join(arbiter["reasons"])
    alerts = snapshot.get("alerts", [])
    alert_list = ("".join(f'<li class="firing">{escape(a)}</li>' for a in alerts) if alerts
                  else '<li class="quiet">none</li>')
    queue = _table("queue", ["", "count"],
                   [["pending", snapshot["queue"].get("pending", 0)], ["judging", snapshot["queue"].get("judging", 0)],
                    ["open canaries (nobody's work)", snapshot["canaries_open"]],
                    ["decided, all time (the planner's estimate)", f"~{snapshot['decided_estimate']}"]])
    counts = per_minute(snapshot["verdicts_last_hour"])
    by_verdict: dict[str, int] = {}
    for row in snapshot["verdicts_last_hour"]:
        by_verdict[row["verdict"]] = by_verdict.get(row["verdict"], 0) + row["count"]
    hour = ", ".join(f"{verdict} {count}" for verdict, count in sorted(by_verdict.items())) or "none"
    canary_of = {c["worker_id"]: c for c in snapshot["last_canaries"]}
    oldest = _age(snapshot["oldest_pending_secs"]) if snapshot["oldest_pending_secs"] else "none waiting"

    def last_canary(worker_id: str) -> str:
        c = canary_of.get(worker_id)
        if c is None:
            return "never"
        outcome = c["verdict"] if c["ok"] else f"{c['verdict']} (FAILED, expected {c['expected']})"
        return f"{outcome}, {_age(c['decided_ago_s'])} ago"

    workers = _table("workers", ["worker", "kind", "state", "last heard", "busy slots", "languages", "last canary"],
                     [[w["worker_id"], w["kind"],
                       w["state"] + (f" ({w['paused_reason']})" if w["paused_reason"] else ""),
                       "never" if w["last_seen_ago_s"] is None else f"{_age(w['last_seen_ago_s'])} ago",
                       f"{w['leases']}/{w['slots']}", ",".join(w["languages"]), last_canary(w["worker_id"])]
                      for w in snapshot["workers"]])
    in_flight = _table("leases", ["submission", "worker", "slot", "gen", "attempt", "age s", "expires in s",
                                  "confirmed"],
                       [[r["submission_id"], r["worker_id"], r["slot"], r["lease_gen"], r["judge_attempts"],
                         r["age_s"], r["expires_in_s"], r["confirmed"]] for r in snapshot["leases"]])
    errors = _table("system-errors", ["submission", "worker", "decided by", "reason", "ago"],
                    [[e["submission_id"], e["worker_id"], e["decided_by"], e["reason"][:200], _age(e["ago_s"])]
                     for e in snapshot["recent_system_errors"]])
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="5">
<title>judge-arbiter status</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse;margin-bottom:1.5em}}
td,th{{border:1px solid #ccc;padding:.2em .6em;text-align:left}}.s{{font-weight:bold}}
#alerts li.firing{{color:#a00;font-weight:bold}}svg{{border:1px solid #ccc;background:#fafafa}}.bar{{fill:#36c}}</style></head>
<body><h1>judge-arbiter</h1>
<p class="s" id="arbiter">{escape(state)} &middot; leading: {_cell(arbiter['leader'])} &middot; parked requests:
{arbiter['parked']} &middot; legacy compatibility: {_cell(arbiter['legacy_compat'])}</p>
<h2>Alerts</h2><ul id="alerts">{alert_list}</ul>
<h2>Queue</h2>{queue}
<p>oldest waiting submission: <span id="oldest-pending">{escape(oldest)}</span></p>
<h2>Decided per minute, last hour</h2>{chart(counts)}
<p>last hour: <span id="hour-total">{sum(counts)}</span> decided ({escape(hour)})</p>
<h2>Workers</h2>{workers}
<h2>Recent system errors</h2>{errors}
<h2>Leases in flight</h2>{in_flight}
</body></html>"""

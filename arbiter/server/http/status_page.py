"""The arbiter's small read-only status page (server-rendered, refreshes itself)."""

from __future__ import annotations

from html import escape


def _table(headers: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body or '<tr><td colspan=9>(none)</td></tr>'}</tbody></table>"


def render(snapshot: dict) -> str:
    arbiter = snapshot["arbiter"]
    state = "ready" if arbiter["ready"] else "NOT READY: " + "; ".join(arbiter["reasons"])
    queue = _table(["status", "count"], [[k, v] for k, v in sorted(snapshot["queue"].items())] +
                   [["decided (estimate)", f"~{snapshot['decided_estimate']}"]])
    in_flight = _table(["submission", "worker", "slot", "gen", "attempt", "age s", "expires in s", "confirmed"],
                       [[r["submission_id"], r["worker_id"], "-" if r["slot"] is None else r["slot"], r["lease_gen"], r["judge_attempts"], r["age_s"],
                         r["expires_in_s"], r["confirmed"]] for r in snapshot["leases"]])
    workers = _table(["worker", "kind", "state", "last heard (s ago)", "busy slots", "languages"],
                     [[w["worker_id"], w["kind"], "revoked" if w["revoked"] else "active",
                       "never" if w["last_seen_ago_s"] is None else f"{w['last_seen_ago_s']:.1f}",
                       f"{w['leases']}/{w['slots']}",
                       ",".join(w["languages"])] for w in snapshot["workers"]])
    canaries = _table(["worker", "canary", "language", "verdict", "expected", "decided (s ago)", "took s"],
                      [[c["worker_id"], c["submission_id"], c["language"],
                        c["verdict"] if c["ok"] else f"{c['verdict']} (FAILED)", c["expected"],
                        c["decided_ago_s"], c["duration_s"]] for c in snapshot["last_canaries"]])
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><meta http-equiv="refresh" content="2">
<title>judge-arbiter status</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse;margin-bottom:1.5em}}
td,th{{border:1px solid #ccc;padding:.2em .6em;text-align:left}}.s{{font-weight:bold}}</style></head>
<body><h1>judge-arbiter</h1>
<p class="s">{escape(state)} &middot; leader: {arbiter['leader']} &middot; parked requests: {arbiter['parked']}
&middot; legacy compatibility: {arbiter['legacy_compat']}</p>
<h2>Queue</h2>{queue}<p>open canaries: {snapshot['canaries_open']}</p>
<h2>Leases in flight</h2>{in_flight}<h2>Workers</h2>{workers}
<h2>Last canary per worker</h2>{canaries}
</body></html>"""

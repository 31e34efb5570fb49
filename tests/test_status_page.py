"""The status page as a contest-day view, rendered by a real headless browser (Debian's Chromium):
its numbers are the database's (live work exactly, the oldest waiting age, decisions per minute
over the last hour, recent system_errors with their reason), each worker with its state and last
canary ("never" when none), and the alert conditions the arbiter sees."""

from __future__ import annotations

import re
import shutil
import subprocess
from html.parser import HTMLParser

import pytest
from support.fixtures_data import seed_problem, seed_user
from support.procs import add_worker
from support.programs import PROGRAMS

from arbiter.store import leases

CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (Debian package chromium)")


def rendered_dom(url: str, tmp_path) -> str:
    """The page's DOM after Chromium loaded and rendered it."""
    done = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                           "--disable-background-networking", "--disable-component-update", "--disable-sync",
                           f"--user-data-dir={tmp_path / 'chromium'}", "--dump-dom", url],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


class Cells(HTMLParser):
    """Each table's rows as lists of cell texts, by the table's id; the text of elements by id."""

    def __init__(self):
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.by_id: dict[str, str] = {}
        self._table = None
        self._cell = None
        self._open_id = None
        self.bars: list[int] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table":
            self._table = attrs.get("id")
            self.tables[self._table] = []
        elif tag == "tr" and self._table:
            self.tables[self._table].append([])
        elif tag in ("td", "th") and self._table:
            self._cell = ""
        elif tag == "rect" and "data-count" in attrs:
            self.bars.append(int(attrs["data-count"]))
        if "id" in attrs and tag not in ("table",):
            self._open_id = attrs["id"]
            self.by_id[self._open_id] = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[self._table][-1].append(self._cell.strip())
            self._cell = None
        elif tag == "table":
            self._table = None
        if self._open_id and tag in ("span", "p", "ul", "svg"):
            self._open_id = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data
        if self._open_id:
            self.by_id[self._open_id] += data


def test_the_status_page_shows_the_contest_as_the_database_has_it(db, arbiters, tmp_path):
    with db.connect() as conn:
        problem = seed_problem(conn, "aplusb")
        user = seed_user(conn)
        add_worker(conn, "home-1", "home")
        add_worker(conn, "prod-1", "production", slots=2)
        add_worker(conn, "home-2", "home")
        conn.execute("INSERT INTO worker_pauses (worker_id, reason) VALUES ('home-2', 'disk check')")
        decided = []
        for verdict, detail in (("AC", {}), ("WA", {}), ("system_error", {"reason": "sandbox will not start"})):
            sid = leases.submit(conn, user, problem, "python3", PROGRAMS["python3"]["AC"])
            lease = leases.acquire(conn, worker_id="home-1", kind="home", request_id=f"r{sid}", languages=["python3"],
                                   unconfirmed_secs=30, legacy=None)
            leases.record_result(conn, worker_id="home-1", submission_id=lease.submission_id,
                                 lease_token=lease.lease_token, verdict=verdict, detail=detail)
            decided.append(lease.submission_id)
        waiting = [leases.submit(conn, user, problem, "python3", PROGRAMS["python3"]["AC"]) for _ in range(4)]
        # One of them has waited 5 minutes: a backlog by the alert's measure.
        conn.execute("UPDATE submissions SET created_at = now() - interval '5 minutes' WHERE id = %s", (waiting[0],))
        pending = conn.execute("SELECT count(*) FROM submissions WHERE status = 'pending' AND canary_expect IS NULL"
                               ).fetchone()[0]
    a = arbiters.start(db.dsn)
    page = Cells()
    page.feed(rendered_dom(a.url + "/status", tmp_path))

    queue = {row[0]: row[1] for row in page.tables["queue"][1:]}
    assert queue["pending"] == str(pending) == "4" and queue["judging"] == "0", queue
    assert page.by_id["oldest-pending"] == "5 min", page.by_id
    assert len(page.bars) == 60 and sum(page.bars) == 3 and page.bars[-1] == 3, page.bars
    assert page.by_id["hour-total"] == "3"
    workers = {row[0]: row for row in page.tables["workers"][1:]}
    assert workers["home-1"][2] == "silent" and workers["home-1"][6] == "never", workers
    assert workers["prod-1"][4] == "0/2", workers
    assert workers["home-2"][2] == "paused (disk check)", workers
    errors = page.tables["system-errors"][1:]
    assert [(row[0], row[1], row[3]) for row in errors] == [(str(decided[2]), "home-1", "sandbox will not start")]
    alerts = page.by_id["alerts"]
    assert "JudgeBacklog: the oldest waiting submission has waited 30" in alerts, alerts
    assert "JudgeSubmissionSystemError: 1 submission(s) ended system_error in the last 15 min" in alerts, alerts
    assert "True" not in page.by_id["arbiter"] and "False" not in page.by_id["arbiter"], page.by_id["arbiter"]
    assert re.search(r"leading: (yes|no)", page.by_id["arbiter"])

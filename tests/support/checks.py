"""Database-level checks shared by scenario and chaos tests."""

from __future__ import annotations


def assert_each_submission_decided_once_by_its_last_lease(conn, expect_terminal: bool = True) -> dict:
    """Every worker-decided verdict was written by the newest lease of its generation, once.

    Returns the status counts.
    """
    rows = conn.execute("SELECT id, status, lease_token, lease_gen FROM submissions ORDER BY id").fetchall()
    counts: dict[str, int] = {}
    for sid, status, token, gen in rows:
        counts[status] = counts.get(status, 0) + 1
        if expect_terminal:
            assert status not in ("pending", "judging"), f"submission {sid} is still {status}"
    decided = conn.execute(
        "SELECT j.submission_id, j.lease_token, j.lease_gen, g.lease_gen AS grant_gen, "
        "       (SELECT max(g2.lease_gen) FROM lease_grants g2 WHERE g2.submission_id = j.submission_id "
        "        AND g2.granted_at <= j.created_at) AS newest_gen_then "
        "FROM submission_judgings j LEFT JOIN lease_grants g ON g.lease_token = j.lease_token "
        "WHERE j.decided_by = 'worker' AND j.lease_token IS NOT NULL").fetchall()  # legacy verdicts carry no lease
    for sid, token, gen, grant_gen, newest in decided:
        assert grant_gen is not None, f"verdict for {sid} names a token no grant issued"
        assert grant_gen == gen == newest, f"verdict for {sid} written by gen {gen}, newest then {newest}"
    dupes = conn.execute("SELECT submission_id, lease_gen, count(*) FROM submission_judgings "
                         "WHERE decided_by = 'worker' GROUP BY 1, 2 HAVING count(*) > 1").fetchall()
    assert not dupes, f"a generation decided twice: {dupes}"
    xp_ok = conn.execute(
        "SELECT bool_and(u.xp = coalesce((SELECT sum(p.xp_reward) FROM first_passes f JOIN problems p "
        "ON p.id = f.problem_id WHERE f.user_id = u.id), 0)) FROM users u").fetchone()[0]
    assert xp_ok in (True, None), "XP does not match first passes"
    return counts

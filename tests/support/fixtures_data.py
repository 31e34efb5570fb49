"""Sample rows for tests: users, problems and submissions through the real statements."""

from __future__ import annotations

import psycopg

from arbiter.store import leases


def seed_problem(conn: psycopg.Connection, slug: str = "aplusb", xp_reward: int = 10,
                 time_limit_ms: int = 1000, memory_limit_kb: int = 262144) -> int:
    return conn.execute(
        "INSERT INTO problems (slug, title, xp_reward, time_limit_ms, memory_limit_kb) VALUES (%s, %s, %s, %s, %s) "
        "RETURNING id",
        (slug, slug.upper(), xp_reward, time_limit_ms, memory_limit_kb),
    ).fetchone()[0]


def seed_user(conn: psycopg.Connection, name: str = "alice") -> int:
    return conn.execute("INSERT INTO users (name) VALUES (%s) RETURNING id", (name,)).fetchone()[0]


def seed_submissions(conn: psycopg.Connection, count: int, language: str = "python3",
                     source: str = "print(sum(map(int, input().split())))") -> list[int]:
    user = seed_user(conn, f"user{conn.execute('SELECT count(*) FROM users').fetchone()[0]}")
    problem = conn.execute("SELECT id FROM problems WHERE slug <> 'judge-canary' ORDER BY id LIMIT 1").fetchone()
    problem_id = problem[0] if problem else seed_problem(conn)
    return [leases.submit(conn, user, problem_id, language, source) for _ in range(count)]

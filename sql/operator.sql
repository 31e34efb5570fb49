-- Statements of the operator's tool (judgectl). Reads and setup only:
-- no arrow of the state machine lives here (those are in queries.sql).

-- name: add_problem
INSERT INTO problems (slug, title, xp_reward, time_limit_ms, memory_limit_kb)
VALUES (%(slug)s, %(title)s, %(xp_reward)s, %(time_limit_ms)s, %(memory_limit_kb)s)
RETURNING id;

-- name: find_problem
SELECT id FROM problems WHERE slug = %(slug)s;

-- name: ensure_user
WITH inserted AS (
    INSERT INTO users (name) VALUES (%(name)s) ON CONFLICT (name) DO NOTHING RETURNING id
)
SELECT id FROM inserted UNION ALL SELECT id FROM users WHERE name = %(name)s LIMIT 1;

-- name: add_worker
INSERT INTO workers (worker_id, kind, languages, secret_sha256)
VALUES (%(worker_id)s, %(kind)s, %(languages)s, %(secret_sha256)s);

-- name: revoke_worker
UPDATE workers SET revoked_at = now() WHERE worker_id = %(worker_id)s AND revoked_at IS NULL;

-- name: status_queue
SELECT status, count(*) AS count FROM submissions GROUP BY status ORDER BY status;

-- name: status_leases
SELECT s.id AS submission_id, s.worker_id, s.lease_gen, s.judge_attempts,
       s.lease_confirmed_at IS NOT NULL AS confirmed,
       round(extract(epoch FROM now() - g.granted_at)::numeric, 1)::float AS age_s,
       round(extract(epoch FROM s.lease_expires_at - now())::numeric, 1)::float AS expires_in_s
FROM submissions s
LEFT JOIN lease_grants g ON g.lease_token = s.lease_token
WHERE s.status = 'judging'
ORDER BY s.id;

-- name: status_workers
SELECT w.worker_id, w.kind, w.languages, w.revoked_at IS NOT NULL AS revoked,
       extract(epoch FROM now() - w.last_seen_at)::float AS last_seen_ago_s,
       (SELECT count(*) FROM submissions s WHERE s.status = 'judging' AND s.worker_id = w.worker_id) AS leases
FROM workers w
ORDER BY w.kind, w.worker_id;

-- name: count_live_arbiter_leases
-- Leases only an arbiter's janitor would hand back: what a rollback must drain before the arbiter goes.
SELECT count(*) FROM submissions WHERE status = 'judging' AND lease_token IS NOT NULL;

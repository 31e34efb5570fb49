-- Statements of the operator's tool (judgectl). Reads and setup only:
-- no arrow of the state machine lives here (those are in queries.sql).

-- name: add_problem
INSERT INTO problems (slug, title, xp_reward, time_limit_ms, memory_limit_kb, comparer, checker_sha256)
VALUES (%(slug)s, %(title)s, %(xp_reward)s, %(time_limit_ms)s, %(memory_limit_kb)s, %(comparer)s, %(checker_sha256)s)
RETURNING id;

-- name: set_problem
-- Only what is given (NULL: unchanged); the comparer and the checker's digest always together.
UPDATE problems
SET time_limit_ms = coalesce(%(time_limit_ms)s, time_limit_ms),
    memory_limit_kb = coalesce(%(memory_limit_kb)s, memory_limit_kb),
    comparer = coalesce(%(comparer)s, comparer),
    checker_sha256 = CASE WHEN %(comparer)s::text IS NULL THEN checker_sha256 ELSE %(checker_sha256)s END
WHERE slug = %(slug)s
RETURNING id, comparer, checker_sha256;

-- name: find_problem
SELECT id FROM problems WHERE slug = %(slug)s;

-- name: find_problem_digest
SELECT data_digest FROM problems WHERE slug = %(slug)s;

-- name: set_problem_data_digest
UPDATE problems SET data_digest = %(data_digest)s WHERE slug = %(slug)s
RETURNING id, (SELECT data_digest FROM problems WHERE slug = %(slug)s) AS previous;

-- name: judged_with_other_data
-- Decided submissions of a problem whose last judging used other test data than the problem's
-- digest now (or an unknown one: judged before digests were kept). Never judged (a system_error
-- after too many releases), compile errors (they never read test data) and canaries are left out.
SELECT s.id
FROM submissions s JOIN problems p ON p.id = s.problem_id
WHERE p.slug = %(slug)s AND s.canary_expect IS NULL
  AND s.status IN ('AC', 'WA', 'TLE', 'MLE', 'RE', 'OLE', 'system_error')
  AND EXISTS (SELECT 1 FROM submission_judgings j WHERE j.submission_id = s.id)
  AND (SELECT j.data_digest FROM submission_judgings j WHERE j.submission_id = s.id ORDER BY j.seq DESC LIMIT 1)
      IS DISTINCT FROM p.data_digest
ORDER BY s.id;

-- name: ensure_user
WITH inserted AS (
    INSERT INTO users (name) VALUES (%(name)s) ON CONFLICT (name) DO NOTHING RETURNING id
)
SELECT id FROM inserted UNION ALL SELECT id FROM users WHERE name = %(name)s LIMIT 1;

-- name: add_worker
INSERT INTO workers (worker_id, kind, languages, secret_sha256, slots)
VALUES (%(worker_id)s, %(kind)s, %(languages)s, %(secret_sha256)s, %(slots)s);

-- name: revoke_worker
-- Both secrets go: a rotation's overlap never outlives a revocation. Each statement that changes a
-- worker's credential or profile NOTIFYs worker_credentials (at commit) with its worker_id: every
-- arbiter process then forgets what it cached of that worker (arbiter/server/credential_cache.py).
WITH revoked AS (
    UPDATE workers SET revoked_at = now(), previous_secret_sha256 = NULL, previous_secret_until = NULL
    WHERE worker_id = %(worker_id)s AND revoked_at IS NULL
    RETURNING worker_id
)
SELECT pg_notify('worker_credentials', worker_id) FROM revoked;

-- name: status_queue
-- Live work, exactly. Each count reads one partial index (submissions_pending_idx,
-- submissions_judging_idx): the cost follows the live work, not the years of history.
-- Canaries are counted apart (they are nobody's work), each from its own small partial index.
SELECT 'pending' AS status,
       (SELECT count(*) FROM submissions WHERE status = 'pending')
       - (SELECT count(*) FROM submissions WHERE status = 'pending' AND canary_expect IS NOT NULL) AS count
UNION ALL
SELECT 'judging',
       (SELECT count(*) FROM submissions WHERE status = 'judging')
       - (SELECT count(*) FROM submissions WHERE status = 'judging' AND canary_expect IS NOT NULL)
UNION ALL
SELECT 'canaries', count(*) FROM submissions
WHERE canary_expect IS NOT NULL AND status IN ('pending', 'judging');

-- name: status_rows_estimate
-- Every submission ever made, as the planner's estimate (pg_class.reltuples, kept current by
-- autovacuum and ANALYZE; -1 before the table was first analyzed). An exact count(*) would read the
-- whole history on every refresh of the status page.
SELECT greatest(reltuples, 0)::bigint AS estimate FROM pg_class WHERE oid = 'submissions'::regclass;

-- name: status_leases
SELECT s.id AS submission_id, s.worker_id,
       CASE WHEN g.worker_id = s.worker_id THEN s.lease_slot END AS slot,  -- a legacy claim has none
       s.lease_gen, s.judge_attempts,
       s.lease_confirmed_at IS NOT NULL AS confirmed,
       round(extract(epoch FROM now() - g.granted_at)::numeric, 1)::float AS age_s,
       round(extract(epoch FROM s.lease_expires_at - now())::numeric, 1)::float AS expires_in_s
FROM submissions s
LEFT JOIN lease_grants g ON g.lease_token = s.lease_token
WHERE s.status = 'judging'
ORDER BY s.id;

-- name: status_workers
SELECT w.worker_id, w.kind, w.languages, w.slots, w.revoked_at IS NOT NULL AS revoked,
       extract(epoch FROM now() - w.last_seen_at)::float AS last_seen_ago_s,
       (SELECT count(*) FROM submissions s WHERE s.status = 'judging' AND s.worker_id = w.worker_id) AS leases
FROM workers w
ORDER BY w.kind, w.worker_id;

-- name: status_workers_with_pauses
-- status_workers on the stage-4 schema, which records paused workers (005_worker_pauses).
SELECT w.worker_id, w.kind, w.languages, w.slots, w.revoked_at IS NOT NULL AS revoked,
       extract(epoch FROM now() - w.last_seen_at)::float AS last_seen_ago_s,
       (SELECT count(*) FROM submissions s WHERE s.status = 'judging' AND s.worker_id = w.worker_id) AS leases,
       p.paused_at IS NOT NULL AS paused, p.reason AS paused_reason
FROM workers w LEFT JOIN worker_pauses p ON p.worker_id = w.worker_id
ORDER BY w.kind, w.worker_id;

-- name: pause_worker
-- The arbiter grants this worker no new lease (its leases run to their end). Nothing when it is
-- paused already (the first pause's time and reason stay). The NOTIFY ('paused') tells the leading
-- arbiter's dispatcher to read the pauses again (it keeps them between looks at the queue).
WITH paused AS (
    INSERT INTO worker_pauses (worker_id, reason)
    SELECT worker_id, %(reason)s FROM workers WHERE worker_id = %(worker_id)s
    ON CONFLICT (worker_id) DO NOTHING
    RETURNING paused_at
)
SELECT paused_at, pg_notify('submission_pending', 'paused') FROM paused;

-- name: count_worker_leases
SELECT count(*) FROM submissions WHERE status = 'judging' AND worker_id = %(worker_id)s;

-- name: resume_worker
-- The worker may get leases again; the NOTIFY ('paused': the pauses changed) wakes the leading
-- arbiter's dispatcher now, which reads the pauses again and serves the requests the worker has parked.
WITH resumed AS (DELETE FROM worker_pauses WHERE worker_id = %(worker_id)s RETURNING paused_at)
SELECT paused_at, pg_notify('submission_pending', 'paused') FROM resumed;

-- name: status_last_canaries
-- Each worker's last decided canary (canaries are few: the janitor forgets old ones).
SELECT DISTINCT ON (s.worker_id) s.worker_id, s.id AS submission_id, s.language, s.status AS verdict,
       s.canary_expect AS expected, s.status = s.canary_expect AS ok, s.pinned_worker IS NOT NULL AS pinned,
       round(extract(epoch FROM now() - s.judged_at)::numeric, 1)::float AS decided_ago_s,
       round(extract(epoch FROM s.judged_at - s.created_at)::numeric, 3)::float AS duration_s
FROM submissions s
WHERE s.canary_expect IS NOT NULL AND s.status NOT IN ('pending', 'judging') AND s.worker_id IS NOT NULL
ORDER BY s.worker_id, s.id DESC;

-- name: count_live_arbiter_leases
-- Leases only an arbiter's janitor would hand back: what a rollback must drain before the arbiter goes.
SELECT count(*) FROM submissions WHERE status = 'judging' AND lease_token IS NOT NULL;

-- name: find_worker_secret
SELECT secret_sha256, revoked_at IS NOT NULL AS revoked, kind, languages, slots FROM workers WHERE worker_id = %(worker_id)s;

-- name: set_worker_profile
WITH changed AS (
    UPDATE workers SET kind = %(kind)s, languages = %(languages)s, slots = %(slots)s
    WHERE worker_id = %(worker_id)s
    RETURNING worker_id
)
SELECT pg_notify('worker_credentials', worker_id) FROM changed;

-- name: rotate_worker_secret
-- A new secret; the one it replaces stays valid for the overlap (DB time), so the worker can be given
-- the new one with no refused request. A revoked worker's old secret is not kept.
WITH rotated AS (
    UPDATE workers
    SET previous_secret_sha256 = CASE WHEN revoked_at IS NULL THEN secret_sha256 END,
        previous_secret_until  = CASE WHEN revoked_at IS NULL THEN now() + make_interval(secs => %(overlap_secs)s) END,
        secret_sha256 = %(secret_sha256)s, revoked_at = NULL
    WHERE worker_id = %(worker_id)s
    RETURNING worker_id, previous_secret_until
)
SELECT previous_secret_until, pg_notify('worker_credentials', worker_id) FROM rotated;

-- Database roles of the cutover (composed with psycopg.sql: {role} and {group} are identifiers,
-- {verifier} a literal SCRAM verifier computed client-side, so no password is ever sent or logged).

-- name: find_role
SELECT rolpassword, rolcanlogin FROM pg_authid WHERE rolname = %(role)s;

-- name: create_login_role
CREATE ROLE {role} LOGIN PASSWORD {verifier};

-- name: set_role_password
ALTER ROLE {role} LOGIN PASSWORD {verifier};

-- name: role_is_member
SELECT pg_has_role(%(role)s, %(group)s, 'MEMBER');

-- name: grant_membership
GRANT {group} TO {role};

-- name: terminate_role_sessions
SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE usename = %(role)s;

-- name: drop_role
DROP ROLE {role};

-- name: tables_missing_arbiter_privileges
-- CASE, not AND: the planner may call the privilege function on rows the relkind test would have dropped.
SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relkind IN ('r', 'S')
  AND CASE c.relkind
        WHEN 'r' THEN NOT has_table_privilege(%(role)s, c.oid, 'SELECT, INSERT, UPDATE')
        ELSE NOT has_sequence_privilege(%(role)s, c.oid, 'USAGE, SELECT')
      END;

-- name: grant_arbiter_privileges
GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA public TO {role};
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {role};

-- name: add_blob
-- A test-data file's content, once (by its SHA-256): its chunks follow in the same transaction.
INSERT INTO test_blobs (sha256, size) VALUES (%(sha256)s, %(size)s) ON CONFLICT (sha256) DO NOTHING
RETURNING sha256;

-- name: add_blob_chunk
INSERT INTO test_blob_chunks (sha256, seq, data) VALUES (%(sha256)s, %(seq)s, %(data)s);

-- name: add_data_file
INSERT INTO test_data_files (digest, path, size, sha256) VALUES (%(digest)s, %(path)s, %(size)s, %(sha256)s)
ON CONFLICT (digest, path) DO NOTHING;

-- name: lock_test_data
-- One judgectl at a time stores or prunes test data (a prune must not take a file stored a moment
-- ago whose listing is not written yet). Held for the session: judgectl's one connection.
SELECT pg_advisory_lock(1247765620);

-- name: unused_data_sets
-- Data sets that are no problem's digest now (what `judgectl data prune` removes), with their size.
SELECT f.digest, count(*) AS files, sum(f.size)::bigint AS bytes
FROM test_data_files f
WHERE NOT EXISTS (SELECT 1 FROM problems p WHERE p.data_digest = f.digest)
GROUP BY f.digest ORDER BY f.digest;

-- name: prune_data_sets
DELETE FROM test_data_files f WHERE NOT EXISTS (SELECT 1 FROM problems p WHERE p.data_digest = f.digest);

-- name: prune_blobs
-- Files no data set lists any more (their chunks go with them).
DELETE FROM test_blobs b WHERE NOT EXISTS (SELECT 1 FROM test_data_files f WHERE f.sha256 = b.sha256)
RETURNING size;

-- name: list_problems
-- Every problem with its live work (each count one partial index, as status_queue).
SELECT p.id, p.slug, p.title, p.time_limit_ms, p.memory_limit_kb, p.comparer, p.data_digest,
       (SELECT count(*) FROM submissions s WHERE s.status = 'pending' AND s.problem_id = p.id) AS pending,
       (SELECT count(*) FROM submissions s WHERE s.status = 'judging' AND s.problem_id = p.id) AS judging
FROM problems p
ORDER BY p.slug;

-- name: show_problem
SELECT p.id, p.slug, p.title, p.xp_reward, p.time_limit_ms, p.memory_limit_kb, p.comparer, p.checker_sha256,
       p.data_digest
FROM problems p WHERE p.slug = %(slug)s;

-- name: problem_status_counts
-- One problem's submissions by status (canaries are nobody's and not counted).
SELECT status, count(*) AS count FROM submissions
WHERE problem_id = %(problem_id)s AND canary_expect IS NULL
GROUP BY status ORDER BY status;

-- name: show_submission
-- One submission as the operator sees it; never its lease token.
SELECT s.id, u.name AS user_name, p.slug AS problem, s.language, s.status, s.worker_id, s.lease_slot,
       s.lease_gen, s.judge_attempts, s.lease_releases, s.canary_expect, s.pinned_worker,
       s.created_at, s.leased_at, s.judged_at, length(s.source) AS source_chars,
       round(extract(epoch FROM s.lease_expires_at - now())::numeric, 1)::float AS expires_in_s
FROM submissions s JOIN users u ON u.id = s.user_id JOIN problems p ON p.id = s.problem_id
WHERE s.id = %(submission_id)s;

-- name: submission_judgings_of
-- A submission's judging history, oldest first; never a token.
SELECT j.seq, j.verdict, j.worker_id, j.slot, j.lease_gen, j.decided_by, j.time_ms, j.memory_kb,
       j.data_digest, j.created_at, g.granted_at
FROM submission_judgings j
LEFT JOIN lease_grants g ON g.lease_token = j.lease_token
WHERE j.submission_id = %(submission_id)s
ORDER BY j.seq;

-- name: list_submissions
-- The newest submissions matching every filter given (a NULL filter matches all); canaries left out.
-- since: submitted at or after, in the database's time.
SELECT s.id, u.name AS user_name, p.slug AS problem, s.language, s.status, s.worker_id, s.lease_gen,
       s.created_at, s.judged_at
FROM submissions s JOIN users u ON u.id = s.user_id JOIN problems p ON p.id = s.problem_id
WHERE s.canary_expect IS NULL
  AND (%(status)s::text IS NULL OR s.status = %(status)s::text)
  AND (%(slug)s::text IS NULL OR p.slug = %(slug)s::text)
  AND (%(since_secs)s::float8 IS NULL OR s.created_at >= now() - make_interval(secs => %(since_secs)s::float8))
  AND (%(since_at)s::timestamptz IS NULL OR s.created_at >= %(since_at)s::timestamptz)
ORDER BY s.id DESC
LIMIT %(limit)s;

-- name: decided_with_status
-- What `rejudge --status` sends back: the submissions (canaries aside) that ended in this status,
-- decided at or after since (the database's time), of one problem when given.
SELECT s.id FROM submissions s JOIN problems p ON p.id = s.problem_id
WHERE s.status = %(status)s::text AND s.canary_expect IS NULL
  AND (%(slug)s::text IS NULL OR p.slug = %(slug)s::text)
  AND (%(since_secs)s::float8 IS NULL OR s.judged_at >= now() - make_interval(secs => %(since_secs)s::float8))
  AND (%(since_at)s::timestamptz IS NULL OR s.judged_at >= %(since_at)s::timestamptz)
ORDER BY s.id;

-- name: find_active_worker
SELECT worker_id, languages FROM workers WHERE worker_id = %(worker_id)s AND revoked_at IS NULL;

-- name: oldest_pending_age
-- The age (DB time) of the oldest pending submission that was never decided: what its user has been
-- waiting. Found in id order on submissions_pending_idx. A rejudged submission waits since its
-- rejudge, which no column records: it counts in the queue's depth, not here.
SELECT coalesce((
    SELECT extract(epoch FROM now() - s.created_at)::float8 FROM submissions s
    WHERE s.status = 'pending' AND s.canary_expect IS NULL
      AND NOT EXISTS (SELECT 1 FROM submission_judgings j WHERE j.submission_id = s.id)
    ORDER BY s.id LIMIT 1), 0) AS age_s;

-- name: status_verdicts_last_hour
-- Decisions per minute over the last hour (DB time) by verdict, canaries left out. Read from the
-- newest judgings backwards (the primary key's order is the order they were written), at most the
-- last 100,000: the page costs what the recent work costs, never the history.
SELECT floor(extract(epoch FROM now() - j.created_at) / 60)::int AS minutes_ago, j.verdict, count(*) AS count
FROM (SELECT submission_id, created_at, verdict FROM submission_judgings ORDER BY id DESC LIMIT 100000) j
JOIN submissions s ON s.id = j.submission_id
WHERE j.created_at >= now() - interval '1 hour' AND s.canary_expect IS NULL
GROUP BY 1, 2 ORDER BY 1, 2;

-- name: status_recent_system_errors
-- The last ten system_errors within the same window: which submission, who decided (a worker, or
-- the janitor when the lease ran out at the last attempt), why, how long ago.
SELECT j.submission_id, j.worker_id, j.decided_by, coalesce(j.detail->>'reason', '') AS reason,
       round(extract(epoch FROM now() - j.created_at)::numeric, 0)::float AS ago_s
FROM submission_judgings j
WHERE j.verdict = 'system_error'
  AND j.id >= coalesce((SELECT min(id) FROM (SELECT id FROM submission_judgings ORDER BY id DESC LIMIT 100000) r), 0)
ORDER BY j.id DESC LIMIT 10;

-- name: worker_tables
-- Which worker registries this schema has: arbiter workers (stage 1 on), legacy nodes (until stage 4).
SELECT to_regclass('workers') IS NOT NULL AS arbiter_workers, to_regclass('judge_nodes') IS NOT NULL AS legacy_nodes;

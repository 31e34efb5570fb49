-- The legacy (direct-DB) worker's statements: the scheme that runs before the
-- cutover and that every rollback returns to. Kept verbatim in behaviour,
-- including its weakness: a report is checked by worker_id only. What stage 0
-- adds: canaries go first, a pinned canary only to its worker, none is credited.

-- name: take_global_lock
SELECT rr_last_home FROM judge_dispatch_state WHERE id = 1 FOR UPDATE;

-- name: mark_node_idle
INSERT INTO judge_nodes (worker_id, kind, idle, last_seen)
VALUES (%(worker_id)s, %(kind)s, true, now())
ON CONFLICT (worker_id) DO UPDATE SET idle = true, last_seen = now(), kind = EXCLUDED.kind;

-- name: idle_home_nodes
SELECT worker_id FROM judge_nodes
WHERE kind = 'home' AND idle AND last_seen > now() - make_interval(secs => %(fresh_secs)s)
ORDER BY worker_id;

-- leased_at is clock_timestamp(), the database's clock as the claim runs: the claim's transaction
-- began before it waited for the global lock, perhaps before the submission was queued, and a
-- now() lease time would then precede its queue time.

-- name: claim_pinned_canary
-- A cutover gate's canary pinned to this worker: taken before the yield rules are asked, since no
-- other worker may take it (a production worker that yields to idle home workers would otherwise
-- never judge its own gate's canary).
UPDATE submissions s
SET status = 'judging', worker_id = %(worker_id)s, judge_attempts = s.judge_attempts + 1, leased_at = clock_timestamp()
FROM problems p
WHERE s.id = (SELECT id FROM submissions
              WHERE status = 'pending' AND canary_expect IS NOT NULL AND pinned_worker = %(worker_id)s
                AND language = ANY(%(languages)s)
              ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
  AND s.status = 'pending' AND p.id = s.problem_id
RETURNING s.id AS submission_id, s.problem_id, p.slug AS problem_slug, s.language, s.source,
          s.judge_attempts, p.time_limit_ms, p.memory_limit_kb, p.comparer, p.checker_sha256, p.data_digest;

-- name: claim_oldest_pending
-- Canaries first (a handful at most: see docs/architecture.md, "Canaries"), then the oldest real
-- submission. coalesce() runs the second scan only when the first found nothing.
WITH candidate AS (
    SELECT coalesce(
        (SELECT id FROM submissions
         WHERE status = 'pending' AND canary_expect IS NOT NULL
           AND (pinned_worker IS NULL OR pinned_worker = %(worker_id)s) AND language = ANY(%(languages)s)
         ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED),
        (SELECT id FROM submissions
         WHERE status = 'pending' AND canary_expect IS NULL AND language = ANY(%(languages)s)
         ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)) AS id
)
UPDATE submissions s
SET status = 'judging', worker_id = %(worker_id)s, judge_attempts = s.judge_attempts + 1, leased_at = clock_timestamp()
FROM candidate, problems p
WHERE s.id = candidate.id AND s.status = 'pending' AND p.id = s.problem_id
RETURNING s.id AS submission_id, s.problem_id, p.slug AS problem_slug, s.language, s.source,
          s.judge_attempts, p.time_limit_ms, p.memory_limit_kb, p.comparer, p.checker_sha256, p.data_digest;

-- name: note_claim
WITH node AS (
    UPDATE judge_nodes SET idle = false, last_seen = now() WHERE worker_id = %(worker_id)s
    RETURNING worker_id
)
UPDATE judge_dispatch_state
SET rr_last_home = CASE WHEN %(kind)s = 'home' THEN %(worker_id)s ELSE rr_last_home END,
    updated_at = now()
WHERE id = 1;

-- name: report_result
-- The first-pass and XP tail is queries.sql's record_result's, on purpose: each scheme's report is one
-- statement (one transaction) of its own file, and SQL cannot share a CTE between two statements.
-- The cutover test checks, with both schemes judging, that XP matches first passes (tests/support/checks.py).
WITH decided AS (
    UPDATE submissions
    SET status = %(verdict)s, judged_at = now()
    WHERE id = %(submission_id)s AND status = 'judging' AND worker_id = %(worker_id)s
    RETURNING id, user_id, problem_id, worker_id, canary_expect
), history AS (
    INSERT INTO submission_judgings (submission_id, worker_id, verdict, time_ms, memory_kb, detail, data_digest)
    SELECT id, worker_id, %(verdict)s, %(time_ms)s, %(memory_kb)s, %(detail)s, %(data_digest)s FROM decided
    RETURNING submission_id
), first_pass AS (
    INSERT INTO first_passes (user_id, problem_id, submission_id)
    SELECT user_id, problem_id, id FROM decided WHERE %(verdict)s = 'AC' AND canary_expect IS NULL
    ON CONFLICT (user_id, problem_id) DO NOTHING
    RETURNING user_id, problem_id
), xp AS (
    UPDATE users u SET xp = u.xp + p.xp_reward
    FROM first_pass fp JOIN problems p ON p.id = fp.problem_id
    WHERE u.id = fp.user_id
    RETURNING u.id
)
SELECT (SELECT count(*) FROM decided) AS decided, (SELECT count(*) FROM xp) AS xp_granted;

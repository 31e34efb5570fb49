-- Statements of the local lab (judge-lab, arbiter/lab/run.py): its progress and its summary. Setup goes
-- through judgectl's own statements (operator.sql).

-- name: progress_by_status
-- The lab's own submissions only: the arbiter's canary probe adds canaries to the same table.
SELECT status, count(*) FROM submissions WHERE canary_expect IS NULL GROUP BY 1;

-- name: decided_of_problem
SELECT count(*) FROM submissions s JOIN problems p ON p.id = s.problem_id
WHERE p.slug = %(slug)s AND s.canary_expect IS NULL AND s.status NOT IN ('pending', 'judging');

-- name: judging_by_worker
SELECT worker_id, count(*) FROM submissions WHERE status = 'judging' AND canary_expect IS NULL GROUP BY 1;

-- name: summary
-- Per submission: its judgings, how many of them used the same test data as another (judged twice
-- for nothing), and the last judging's slot and whether it used the problem's current test data.
SELECT s.id, p.slug, s.language, s.status, s.worker_id, s.judge_attempts,
       (SELECT count(*) FROM submission_judgings j WHERE j.submission_id = s.id) AS judged,
       (SELECT count(*) - count(DISTINCT coalesce(j.data_digest, '')) FROM submission_judgings j
        WHERE j.submission_id = s.id) AS repeated,
       last.slot, last.data_digest IS NOT DISTINCT FROM p.data_digest AS current_data
FROM submissions s JOIN problems p ON p.id = s.problem_id
LEFT JOIN LATERAL (SELECT j.slot, j.data_digest FROM submission_judgings j WHERE j.submission_id = s.id
                   ORDER BY j.seq DESC LIMIT 1) last ON true
WHERE s.canary_expect IS NULL
ORDER BY s.id;

-- name: canary_summary
SELECT count(*) FILTER (WHERE status = canary_expect), count(*)
FROM submissions WHERE canary_expect IS NOT NULL AND status NOT IN ('pending', 'judging');

-- name: first_grant_after
-- When the first lease after a moment (epoch seconds) was granted, by the database's clock (--ha).
SELECT extract(epoch FROM min(granted_at))::float8 FROM lease_grants WHERE granted_at > to_timestamp(%(at)s);

-- name: progress_more
-- What the progress line adds: the lab's submissions decided at least once (a rejudge sends one back
-- to the queue, but never takes its decision back: this count never goes down), its decisions so far
-- (for the throughput), whether any worker has taken a lease yet, the oldest waiting one's age.
SELECT (SELECT count(DISTINCT j.submission_id) FROM submission_judgings j
        JOIN submissions s ON s.id = j.submission_id WHERE s.canary_expect IS NULL) AS ever_decided,
       (SELECT count(*) FROM submission_judgings j
        JOIN submissions s ON s.id = j.submission_id WHERE s.canary_expect IS NULL) AS decisions,
       EXISTS (SELECT 1 FROM lease_grants g JOIN submissions s ON s.id = g.submission_id
               WHERE s.canary_expect IS NULL) AS any_lease,
       coalesce((SELECT extract(epoch FROM now() - min(created_at))::float8 FROM submissions
                 WHERE status = 'pending' AND canary_expect IS NULL), 0) AS oldest_pending_s;

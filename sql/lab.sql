-- Statements of the local lab (judge-lab, arbiter/lab.py): its progress and its summary. Setup goes
-- through judgectl's own statements (operator.sql).

-- name: progress_by_status
-- The lab's own submissions only: the arbiter's canary probe adds canaries to the same table.
SELECT status, count(*) FROM submissions WHERE canary_expect IS NULL GROUP BY 1;

-- name: judging_by_worker
SELECT worker_id, count(*) FROM submissions WHERE status = 'judging' AND canary_expect IS NULL GROUP BY 1;

-- name: summary
SELECT s.id, p.slug, s.language, s.status, s.worker_id, s.judge_attempts,
       (SELECT count(*) FROM submission_judgings j WHERE j.submission_id = s.id)
FROM submissions s JOIN problems p ON p.id = s.problem_id
WHERE s.canary_expect IS NULL
ORDER BY s.id;

-- name: canary_summary
SELECT count(*) FILTER (WHERE status = canary_expect), count(*)
FROM submissions WHERE canary_expect IS NOT NULL AND status NOT IN ('pending', 'judging');

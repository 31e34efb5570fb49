-- Back to the legacy site as it was found: canaries and their built-in problem go.
-- (Runs after 003 is rolled back, so no history trigger or lease row refers to them any more.)
DELETE FROM submission_judgings WHERE submission_id IN
    (SELECT id FROM submissions WHERE canary_expect IS NOT NULL);
DELETE FROM submissions WHERE canary_expect IS NOT NULL;
DELETE FROM problems WHERE slug = 'judge-canary'
    AND NOT EXISTS (SELECT 1 FROM submissions s WHERE s.problem_id = problems.id);
DELETE FROM users WHERE name = 'judge-canary'
    AND NOT EXISTS (SELECT 1 FROM submissions s WHERE s.user_id = users.id);
DROP TRIGGER submissions_pin_guard ON submissions;
DROP FUNCTION submissions_pin_guard();
DROP INDEX submissions_canary_idx;
DROP INDEX submissions_canary_pending_idx;
ALTER TABLE submissions
    DROP CONSTRAINT submissions_only_canaries_are_pinned,
    DROP COLUMN leased_at,
    DROP COLUMN pinned_worker,
    DROP COLUMN canary_expect;
-- The legacy judge compared tokens only: a problem's comparer and checker go with this schema.
ALTER TABLE problems
    DROP CONSTRAINT problems_checker_has_its_digest,
    DROP COLUMN checker_sha256,
    DROP COLUMN comparer;
ALTER TABLE submission_judgings DROP COLUMN data_digest;
ALTER TABLE problems DROP COLUMN data_digest;
DROP TABLE test_data_files;
DROP TABLE test_blob_chunks;
DROP TABLE test_blobs;

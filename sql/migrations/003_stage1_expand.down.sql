-- Rollback of stage 1. Leases in flight are handed back to the legacy scheme:
-- a leased 'judging' row has no legacy owner that would ever report it, so it returns to 'pending'.
UPDATE submissions SET status = 'pending', worker_id = NULL
WHERE status = 'judging' AND lease_token IS NOT NULL;

DROP TRIGGER submission_pending_notify_update ON submissions;
DROP TRIGGER submission_pending_notify_insert ON submissions;
DROP FUNCTION notify_submission_pending();
DROP TRIGGER submission_judgings_append_only ON submission_judgings;
DROP FUNCTION submission_judgings_append_only();
DROP INDEX submission_judgings_lease_idx;
ALTER TABLE submission_judgings
    DROP COLUMN slot,
    DROP COLUMN decided_by,
    DROP COLUMN lease_gen,
    DROP COLUMN lease_token,
    DROP COLUMN seq;
DROP TABLE lease_grants;
DROP TABLE workers;
ALTER TABLE submissions
    DROP COLUMN lease_slot,
    DROP COLUMN lease_releases,
    DROP COLUMN lease_confirmed_at,
    DROP COLUMN lease_expires_at,
    DROP COLUMN lease_gen,
    DROP COLUMN lease_token;

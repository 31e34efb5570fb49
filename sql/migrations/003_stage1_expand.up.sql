-- Stage 1 (expand): everything the arbiter needs. Legacy workers ignore all of it:
-- new columns have defaults, nothing legacy reads or writes changes meaning.

ALTER TABLE submissions
    ADD COLUMN lease_token          uuid,
    ADD COLUMN lease_gen            bigint NOT NULL DEFAULT 0 CHECK (lease_gen >= 0),
    ADD COLUMN lease_expires_at     timestamptz,
    ADD COLUMN lease_confirmed_at   timestamptz,
    -- Leases handed back by their workers since the last rejudge (release_lease); bounded.
    ADD COLUMN lease_releases       integer NOT NULL DEFAULT 0 CHECK (lease_releases >= 0),
    -- The worker's judge slot the lease went to (0 .. workers.slots - 1; kept after the lease ends,
    -- like worker_id). On the row itself, so whoever records the result (the legacy role delivering
    -- an arbiter outbox entry after a rollback included) reads it with the row it decides.
    ADD COLUMN lease_slot           smallint CHECK (lease_slot >= 0);
CREATE UNIQUE INDEX submissions_lease_token_idx ON submissions (lease_token) WHERE lease_token IS NOT NULL;
CREATE INDEX submissions_lease_expiry_idx ON submissions (lease_expires_at) WHERE status = 'judging';

-- Judge workers that talk to the arbiter, with the SHA-256 of their bearer secret. A rotation keeps
-- the previous secret valid until previous_secret_until (DB time), so the new one can be rolled out
-- to the worker with no refused request.
CREATE TABLE workers (
    worker_id       text PRIMARY KEY CHECK (worker_id ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
    kind            text NOT NULL CHECK (kind IN ('home', 'production')),
    languages       text[] NOT NULL DEFAULT ARRAY['c', 'cpp', 'python3'],
    secret_sha256   text NOT NULL,
    previous_secret_sha256  text,
    previous_secret_until   timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    revoked_at      timestamptz,
    -- How many judge slots the worker runs (each parks its own acquires; worker config `slots`).
    slots           smallint NOT NULL DEFAULT 1 CHECK (slots BETWEEN 1 AND 256),
    last_seen_at    timestamptz,
    last_lease_at   timestamptz
);

-- Every lease ever granted. (worker_id, request_id) makes acquire idempotent:
-- a retried request finds its grant and gets the same lease back.
CREATE TABLE lease_grants (
    lease_token     uuid PRIMARY KEY,
    submission_id   bigint NOT NULL REFERENCES submissions (id),
    lease_gen       bigint NOT NULL,
    worker_id       text NOT NULL,
    request_id      text NOT NULL,
    granted_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (worker_id, request_id),
    UNIQUE (submission_id, lease_gen)
);

-- History names the lease that decided each row; seq only grows.
CREATE SEQUENCE submission_judgings_seq;
ALTER TABLE submission_judgings
    ADD COLUMN seq          bigint NOT NULL DEFAULT nextval('submission_judgings_seq'),
    ADD COLUMN lease_token  uuid,
    ADD COLUMN lease_gen    bigint,
    ADD COLUMN decided_by   text NOT NULL DEFAULT 'worker' CHECK (decided_by IN ('worker', 'janitor')),
    ADD COLUMN slot         smallint;
ALTER SEQUENCE submission_judgings_seq OWNED BY submission_judgings.seq;
CREATE UNIQUE INDEX submission_judgings_lease_idx ON submission_judgings (submission_id, lease_token);
GRANT USAGE ON SEQUENCE submission_judgings_seq TO judge_legacy_worker;

-- History is append-only, except that a canary's rows go with the canary when old canaries are
-- cleaned up (forget_old_canaries): a canary is a probe, not anyone's submission.
CREATE FUNCTION submission_judgings_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND EXISTS (SELECT 1 FROM submissions s
                                    WHERE s.id = OLD.submission_id AND s.canary_expect IS NOT NULL) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'submission_judgings is append-only (% refused)', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;
CREATE TRIGGER submission_judgings_append_only
    BEFORE UPDATE OR DELETE ON submission_judgings
    FOR EACH ROW EXECUTE FUNCTION submission_judgings_append_only();

-- Wake the arbiter's dispatcher when work becomes claimable (new, reclaimed, rejudged).
-- The payload is the language; NOTIFY folds identical payloads within a transaction.
CREATE FUNCTION notify_submission_pending() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('submission_pending', NEW.language);
    RETURN NULL;
END
$$;
CREATE TRIGGER submission_pending_notify_insert
    AFTER INSERT ON submissions
    FOR EACH ROW WHEN (NEW.status = 'pending')
    EXECUTE FUNCTION notify_submission_pending();
CREATE TRIGGER submission_pending_notify_update
    AFTER UPDATE OF status ON submissions
    FOR EACH ROW WHEN (NEW.status = 'pending' AND OLD.status IS DISTINCT FROM 'pending')
    EXECUTE FUNCTION notify_submission_pending();

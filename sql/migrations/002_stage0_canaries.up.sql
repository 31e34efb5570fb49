-- Stage 0 (the legacy site made ready for the cutover): canary submissions.
-- A canary is a known program with a known expected verdict on a built-in problem, judged through
-- every arrow a real submission takes, credited to nobody. Additive only: legacy code that knows
-- nothing of canaries reads and writes the table as before (every new column is nullable).

ALTER TABLE submissions
    -- The verdict the canary must get; NULL for every real submission (that is what makes a canary).
    ADD COLUMN canary_expect text CHECK (canary_expect IN
        ('AC', 'WA', 'TLE', 'MLE', 'RE', 'CE', 'OLE', 'system_error')),
    -- Only this worker may take it (a cutover gate's canary); NULL: any worker (the standing probe).
    ADD COLUMN pinned_worker text,
    -- When the current judging began (a claim or a lease): the canary's queued -> leased timing.
    ADD COLUMN leased_at timestamptz,
    ADD CONSTRAINT submissions_only_canaries_are_pinned CHECK (pinned_worker IS NULL OR canary_expect IS NOT NULL);

-- Canaries go to the front of the queue: each claim looks here first (a handful of rows at most).
CREATE INDEX submissions_canary_pending_idx ON submissions (id)
    WHERE status = 'pending' AND canary_expect IS NOT NULL;
-- The last canary per worker, and the clean-up of old canaries.
CREATE INDEX submissions_canary_idx ON submissions (created_at) WHERE canary_expect IS NOT NULL;

-- The pin holds whatever code runs the claim (a legacy worker not yet upgraded knows nothing of
-- pins): a claim of a pinned canary by anyone but its worker changes nothing, as if the row were taken.
CREATE FUNCTION submissions_pin_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RETURN NULL;
END;
$$;
CREATE TRIGGER submissions_pin_guard
    BEFORE UPDATE ON submissions
    FOR EACH ROW
    WHEN (NEW.pinned_worker IS NOT NULL AND NEW.status = 'judging'
          AND NEW.worker_id IS DISTINCT FROM NEW.pinned_worker)
    EXECUTE FUNCTION submissions_pin_guard();

-- How a test's output is judged (arbiter/protocol/compare.py): tokens (the default, what the legacy judge
-- always did), lines, float:abs=A,rel=R, or the problem's own checker, whose source's SHA-256 the
-- database holds so that no worker judges with another checker than the one set. Here, not later:
-- the workers of every stage read it, the legacy transport's too.
ALTER TABLE problems
    ADD COLUMN comparer text NOT NULL DEFAULT 'tokens'
        CHECK (comparer ~ '^(tokens|lines|checker|float:abs=[0-9.eE+-]+,rel=[0-9.eE+-]+)$'),
    ADD COLUMN checker_sha256 text CHECK (checker_sha256 ~ '^[0-9a-f]{64}$'),
    ADD CONSTRAINT problems_checker_has_its_digest CHECK ((comparer = 'checker') = (checker_sha256 IS NOT NULL));

-- Test data as a fact of the database (arbiter/protocol/testdata.py): the digest of the problem's test data as
-- set by judgectl problem data; a worker whose copy has another digest does not judge. Every history
-- row records the digest it was judged with, so a change of the data finds what to rejudge.
ALTER TABLE problems ADD COLUMN data_digest text CHECK (data_digest ~ '^[0-9a-f]{64}$');
ALTER TABLE submission_judgings ADD COLUMN data_digest text CHECK (data_digest ~ '^[0-9a-f]{64}$');

-- The content of test data, content-addressed: judgectl problem data stores each file once (by its
-- SHA-256, in 1 MiB chunks) with the listing of every data set; the arbiter serves both to workers,
-- chunk by chunk and resumable (arbiter/store/testblobs.py). In the database, not on one host's disk:
-- every arbiter and every backup has it, and judgectl needs nothing but its connection.
CREATE TABLE test_blobs (
    sha256      text PRIMARY KEY CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    size        bigint NOT NULL CHECK (size >= 0),
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE test_blob_chunks (
    sha256  text NOT NULL REFERENCES test_blobs (sha256) ON DELETE CASCADE,
    seq     integer NOT NULL CHECK (seq >= 0),
    data    bytea NOT NULL,
    PRIMARY KEY (sha256, seq)
);
CREATE TABLE test_data_files (
    digest  text NOT NULL CHECK (digest ~ '^[0-9a-f]{64}$'),
    path    text NOT NULL,
    size    bigint NOT NULL,
    sha256  text NOT NULL REFERENCES test_blobs (sha256),
    PRIMARY KEY (digest, path)
);

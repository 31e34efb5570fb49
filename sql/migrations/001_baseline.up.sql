-- Baseline: the legacy schema as it runs before the cutover.
-- Legacy workers log in with their own DB account (member of judge_legacy_worker),
-- serialise on the judge_dispatch_state row (the "global lock") and report with
-- a worker_id check only.

CREATE TABLE users (
    id          bigserial PRIMARY KEY,
    name        text NOT NULL UNIQUE,
    xp          bigint NOT NULL DEFAULT 0 CHECK (xp >= 0)
);

CREATE TABLE problems (
    id              bigserial PRIMARY KEY,
    slug            text NOT NULL UNIQUE,
    title           text NOT NULL,
    xp_reward       integer NOT NULL DEFAULT 10 CHECK (xp_reward >= 0),
    time_limit_ms   integer NOT NULL DEFAULT 1000 CHECK (time_limit_ms > 0),
    memory_limit_kb integer NOT NULL DEFAULT 262144 CHECK (memory_limit_kb > 0)
);

CREATE TABLE submissions (
    id              bigserial PRIMARY KEY,
    user_id         bigint NOT NULL REFERENCES users (id),
    problem_id      bigint NOT NULL REFERENCES problems (id),
    language        text NOT NULL CHECK (language IN ('c', 'cpp', 'python3')),
    source          text NOT NULL,
    status          text NOT NULL DEFAULT 'pending' CHECK (status IN
                        ('pending', 'judging', 'AC', 'WA', 'TLE', 'MLE', 'RE', 'CE', 'OLE', 'system_error')),
    worker_id       text,
    judge_attempts  integer NOT NULL DEFAULT 0,
    created_at      timestamptz NOT NULL DEFAULT now(),
    judged_at       timestamptz
);
CREATE INDEX submissions_pending_idx ON submissions (id) WHERE status = 'pending';
CREATE INDEX submissions_judging_idx ON submissions (worker_id) WHERE status = 'judging';

-- Judging history: one row per decided judging.
CREATE TABLE submission_judgings (
    id              bigserial PRIMARY KEY,
    submission_id   bigint NOT NULL REFERENCES submissions (id),
    worker_id       text NOT NULL,
    verdict         text NOT NULL CHECK (verdict IN ('AC', 'WA', 'TLE', 'MLE', 'RE', 'CE', 'OLE', 'system_error')),
    time_ms         integer,
    memory_kb       integer,
    detail          jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX submission_judgings_submission_idx ON submission_judgings (submission_id);

-- First pass of a problem by a user: the XP grant is keyed on this insert.
CREATE TABLE first_passes (
    user_id         bigint NOT NULL REFERENCES users (id),
    problem_id      bigint NOT NULL REFERENCES problems (id),
    submission_id   bigint NOT NULL REFERENCES submissions (id),
    passed_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, problem_id)
);

-- Which legacy workers exist and whether they are idle (drives the yield rules).
CREATE TABLE judge_nodes (
    worker_id   text PRIMARY KEY,
    kind        text NOT NULL CHECK (kind IN ('home', 'production')),
    idle        boolean NOT NULL DEFAULT true,
    last_seen   timestamptz NOT NULL DEFAULT now()
);

-- The shared round-robin row. Locking it FOR UPDATE is the legacy "global lock".
CREATE TABLE judge_dispatch_state (
    id              integer PRIMARY KEY CHECK (id = 1),
    rr_last_home    text,
    updated_at      timestamptz NOT NULL DEFAULT now()
);
INSERT INTO judge_dispatch_state (id) VALUES (1);

-- Legacy DB role: each legacy worker host gets a LOGIN role that is a member of it.
-- Roles are cluster-wide, so creation is guarded.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'judge_legacy_worker') THEN
        CREATE ROLE judge_legacy_worker NOLOGIN;
    END IF;
END
$$;
GRANT SELECT ON users, problems TO judge_legacy_worker;
GRANT SELECT, UPDATE ON submissions TO judge_legacy_worker;
GRANT UPDATE (xp) ON users TO judge_legacy_worker;
GRANT SELECT, INSERT ON submission_judgings, first_passes TO judge_legacy_worker;
GRANT USAGE ON SEQUENCE submission_judgings_id_seq TO judge_legacy_worker;
GRANT SELECT, INSERT, UPDATE ON judge_nodes TO judge_legacy_worker;
GRANT SELECT, UPDATE ON judge_dispatch_state TO judge_legacy_worker;

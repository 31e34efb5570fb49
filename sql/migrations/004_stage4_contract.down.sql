-- Rollback of stage 4: recreate the legacy dispatch state exactly as the baseline made it.
-- The two tables repeat 001_baseline.up.sql's on purpose: a migration is a frozen text, never
-- built from another that a later change could edit.
CREATE TABLE judge_nodes (
    worker_id   text PRIMARY KEY,
    kind        text NOT NULL CHECK (kind IN ('home', 'production')),
    idle        boolean NOT NULL DEFAULT true,
    last_seen   timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE judge_dispatch_state (
    id              integer PRIMARY KEY CHECK (id = 1),
    rr_last_home    text,
    updated_at      timestamptz NOT NULL DEFAULT now()
);
INSERT INTO judge_dispatch_state (id) VALUES (1);
GRANT SELECT, INSERT, UPDATE ON judge_nodes TO judge_legacy_worker;
GRANT SELECT, UPDATE ON judge_dispatch_state TO judge_legacy_worker;

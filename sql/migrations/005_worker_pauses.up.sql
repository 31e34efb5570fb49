-- Workers the operator paused (judgectl worker pause): the arbiter grants them no new lease; the
-- leases they hold run to their end. One row per paused worker; resume deletes it.
-- Applied with the stage-4 contract (the ledger is one line, and this comes after 004): arbiters
-- of stages 2-3 run without it and look for it again as they look for the legacy tables.
CREATE TABLE worker_pauses (
    worker_id   text PRIMARY KEY REFERENCES workers (worker_id) ON DELETE CASCADE,
    paused_at   timestamptz NOT NULL DEFAULT now(),
    reason      text NOT NULL DEFAULT '' CHECK (length(reason) <= 200)
);

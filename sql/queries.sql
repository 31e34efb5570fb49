-- The arbiter's named statements. Each arrow of the submission state machine
-- (docs/architecture.md) is exactly one statement here, and every one of them
-- carries its precondition in its WHERE clause: zero rows means nothing happened.
-- Lease time is always the database's now().

-- name: submit
-- arrow: (new) -> pending
INSERT INTO submissions (user_id, problem_id, language, source)
VALUES (%(user_id)s, %(problem_id)s, %(language)s, %(source)s)
RETURNING id;

-- name: acquire_lease
-- arrow: pending -> judging. New random token, gen+1, attempts+1, short unconfirmed expiry.
-- The grant row is written in the same statement; (worker_id, request_id) is unique.
WITH candidate AS (
    -- Canaries first (unpinned, or pinned to this worker), then the oldest real submission;
    -- coalesce() runs the second scan only when the first found nothing.
    SELECT coalesce(
        (SELECT id FROM submissions
         WHERE status = 'pending' AND canary_expect IS NOT NULL
           AND (pinned_worker IS NULL OR pinned_worker = %(worker_id)s) AND language = ANY(%(languages)s)
         ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED),
        (SELECT id FROM submissions
         WHERE status = 'pending' AND canary_expect IS NULL AND language = ANY(%(languages)s)
         ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)) AS id
), leased AS (
    UPDATE submissions s
    SET status = 'judging',
        worker_id = %(worker_id)s,
        lease_slot = %(slot)s,
        lease_token = gen_random_uuid(),
        lease_gen = s.lease_gen + 1,
        judge_attempts = s.judge_attempts + 1,
        lease_expires_at = now() + make_interval(secs => %(unconfirmed_secs)s),
        lease_confirmed_at = NULL,
        leased_at = clock_timestamp()  -- when the row was taken, not when the transaction began
    FROM candidate
    -- A second line: the candidate was locked FOR UPDATE, which under READ COMMITTED checks its
    -- WHERE again on the row's newest version (docs/reliability.md, the mutation table).
    WHERE s.id = candidate.id AND s.status = 'pending'
    RETURNING s.id, s.problem_id, s.language, s.source, s.lease_token, s.lease_gen,
              s.lease_expires_at, s.judge_attempts,
              extract(epoch FROM s.leased_at - s.created_at)::float8 AS queue_wait_secs
), granted AS (
    INSERT INTO lease_grants (lease_token, submission_id, lease_gen, worker_id, request_id)
    SELECT lease_token, id, lease_gen, %(worker_id)s, %(request_id)s FROM leased
    RETURNING lease_token
), noted AS (
    UPDATE workers SET last_lease_at = now()
    WHERE worker_id = %(worker_id)s AND EXISTS (SELECT 1 FROM leased)
    RETURNING worker_id
)
SELECT leased.id AS submission_id, leased.problem_id, p.slug AS problem_slug, leased.language,
       leased.source, leased.lease_token, leased.lease_gen, leased.lease_expires_at,
       leased.judge_attempts, p.time_limit_ms, p.memory_limit_kb, p.comparer, p.checker_sha256, p.data_digest,
       leased.queue_wait_secs,
       (SELECT count(*) FROM granted) AS granted, (SELECT count(*) FROM noted) AS noted
FROM leased JOIN problems p ON p.id = leased.problem_id;

-- name: acquire_leases
-- arrow: pending -> judging for up to K parked requests at once (batch dispatch), the same arrow as
-- acquire_lease: new token, gen+1, attempts+1, short unconfirmed expiry, a grant row each. Its SET
-- list is acquire_lease's on purpose (the same arrow, two statements: one request, or a round's batch).
-- The requests (worker_ids[i], request_ids[i], slots[i]) come in the dispatcher's fairness order and share
-- one language set; the i-th oldest claimable unpinned submission (canaries first) goes to the
-- i-th request. Pinned canaries are left to acquire_lease, which looks at one worker's pins.
WITH wanted AS (
    SELECT w AS worker_id, r AS request_id, sl AS slot, ord
    FROM unnest(%(worker_ids)s::text[], %(request_ids)s::text[], %(slots)s::smallint[]) WITH ORDINALITY AS t(w, r, sl, ord)
), canaries AS (
    SELECT id FROM submissions
    WHERE status = 'pending' AND canary_expect IS NOT NULL AND pinned_worker IS NULL
      AND language = ANY(%(languages)s)
    ORDER BY id LIMIT %(k)s FOR UPDATE SKIP LOCKED
), reals AS (
    SELECT id FROM submissions
    WHERE status = 'pending' AND canary_expect IS NULL AND language = ANY(%(languages)s)
    ORDER BY id LIMIT %(k)s FOR UPDATE SKIP LOCKED
), candidates AS (
    SELECT id, row_number() OVER (ORDER BY is_real, id) AS ord
    FROM (SELECT id, false AS is_real FROM canaries UNION ALL SELECT id, true FROM reals) c
), pairs AS (
    SELECT c.id, w.worker_id, w.request_id, w.slot FROM candidates c JOIN wanted w ON w.ord = c.ord
), leased AS (
    UPDATE submissions s
    SET status = 'judging',
        worker_id = pairs.worker_id,
        lease_slot = pairs.slot,
        lease_token = gen_random_uuid(),
        lease_gen = s.lease_gen + 1,
        judge_attempts = s.judge_attempts + 1,
        lease_expires_at = now() + make_interval(secs => %(unconfirmed_secs)s),
        lease_confirmed_at = NULL,
        leased_at = clock_timestamp()  -- when the row was taken, not when the transaction began
    FROM pairs
    WHERE s.id = pairs.id AND s.status = 'pending'
    RETURNING s.id, s.problem_id, s.language, s.source, s.lease_token, s.lease_gen,
              s.lease_expires_at, s.judge_attempts, pairs.worker_id, pairs.request_id,
              extract(epoch FROM s.leased_at - s.created_at)::float8 AS queue_wait_secs
), granted AS (
    INSERT INTO lease_grants (lease_token, submission_id, lease_gen, worker_id, request_id)
    SELECT lease_token, id, lease_gen, worker_id, request_id FROM leased
    RETURNING lease_token
), noted AS (
    UPDATE workers SET last_lease_at = now()
    WHERE worker_id IN (SELECT worker_id FROM leased)
    RETURNING worker_id
)
SELECT leased.worker_id, leased.request_id,
       leased.id AS submission_id, leased.problem_id, p.slug AS problem_slug, leased.language,
       leased.source, leased.lease_token, leased.lease_gen, leased.lease_expires_at,
       leased.judge_attempts, p.time_limit_ms, p.memory_limit_kb, p.comparer, p.checker_sha256, p.data_digest,
       leased.queue_wait_secs,
       (SELECT count(*) FROM granted) AS granted, (SELECT count(*) FROM noted) AS noted
FROM leased JOIN problems p ON p.id = leased.problem_id;

-- name: find_lease_grants
-- read: the leases earlier acquires with these request_ids got (idempotent acquire), and whether each
-- is still live; a dispatch round looks up the requests parked since the last one at once, and only
-- those served before have a row. One index probe per request (LATERAL ... LIMIT 1: the pair is
-- unique): a join would let the planner hash all of lease_grants, which only grows.
SELECT r.worker_id, r.request_id, g.submission_id, g.lease_token, g.lease_gen, p.slug AS problem_slug,
       s.problem_id, s.language, s.source, s.lease_expires_at, s.judge_attempts, p.time_limit_ms,
       p.memory_limit_kb, p.comparer, p.checker_sha256, p.data_digest,
       (s.status = 'judging' AND s.lease_token = g.lease_token) AS live
FROM unnest(%(worker_ids)s::text[], %(request_ids)s::text[]) AS r(worker_id, request_id)
CROSS JOIN LATERAL (
    SELECT g.submission_id, g.lease_token, g.lease_gen FROM lease_grants g
    WHERE g.worker_id = r.worker_id AND g.request_id = r.request_id
    LIMIT 1
) g
JOIN submissions s ON s.id = g.submission_id
JOIN problems p ON p.id = s.problem_id;

-- name: heartbeat_lease
-- arrow: judging -> judging (confirm on the first call, extend on each), for every heartbeat of a
-- batch: the ones a serving process received together, written as one statement (group commit,
-- arbiter/server/group_commit.py; a single heartbeat is a batch of one). `held` locks each row by
-- its id and keeps it only if, locked, it is still judging under this token and worker (the lock
-- takes the row's newest version: a change committed meanwhile is seen); from then on the row is
-- this statement's. One primary-key probe per heartbeat (LIMIT 1 keeps the check out of the probe:
-- with statistics from before a contest's leases the planner took a partial index on judging rows
-- and read all of them for each probe), in the arrays' order, which is the submissions'
-- (arbiter/store/leases.py sorts them; a LATERAL runs once per row of its left side, in that
-- side's order): rows are locked in id order, so two batches, or a batch and a one-row statement,
-- never wait on each other in a cycle. A stale heartbeat locks a row it then leaves alone, for the
-- statement's few milliseconds.
WITH held AS MATERIALIZED (
    SELECT s.id
    FROM unnest(%(submission_ids)s::bigint[], %(lease_tokens)s::uuid[], %(worker_ids)s::text[])
        AS b(submission_id, lease_token, worker_id)
    CROSS JOIN LATERAL (
        SELECT id, status, lease_token, worker_id FROM submissions WHERE id = b.submission_id
        LIMIT 1 FOR NO KEY UPDATE
    ) s
    WHERE s.status = 'judging' AND s.lease_token = b.lease_token AND s.worker_id = b.worker_id
)
UPDATE submissions s
SET lease_expires_at = now() + make_interval(secs => %(lease_secs)s),
    lease_confirmed_at = coalesce(s.lease_confirmed_at, now())
FROM held
WHERE s.id = held.id
RETURNING s.id, s.lease_token, s.worker_id, s.lease_expires_at;

-- name: record_result
-- arrow: judging -> verdict, for every result of a batch (group commit, as heartbeat_lease; a single
-- result is a batch of one; each row checked and locked in id order by `held`, as there). History
-- row, verdict, first pass and XP in one statement: XP is granted only for the first passes that
-- inserted (two accepted solutions of one problem by one user in one batch: the older submission's),
-- summed per user (one user's first passes of two problems in one batch: both rewards).
WITH report AS (
    SELECT * FROM unnest(%(submission_ids)s::bigint[], %(lease_tokens)s::uuid[], %(worker_ids)s::text[],
                         %(verdicts)s::text[], %(times_ms)s::int[], %(memories_kb)s::int[], %(details)s::jsonb[],
                         %(data_digests)s::text[]) WITH ORDINALITY
        AS r(submission_id, lease_token, worker_id, verdict, time_ms, memory_kb, detail, data_digest, ord)
), held AS MATERIALIZED (
    SELECT s.id, r.ord
    FROM report r
    CROSS JOIN LATERAL (
        SELECT id, status, lease_token, worker_id FROM submissions WHERE id = r.submission_id
        LIMIT 1 FOR NO KEY UPDATE
    ) s
    WHERE s.status = 'judging' AND s.lease_token = r.lease_token AND s.worker_id = r.worker_id
), decided AS (
    UPDATE submissions s
    SET status = r.verdict, judged_at = now(), lease_expires_at = NULL
    FROM held JOIN report r ON r.ord = held.ord
    WHERE s.id = held.id
    RETURNING s.id, s.user_id, s.problem_id, s.worker_id, s.lease_token, s.lease_gen, s.canary_expect, s.lease_slot,
              r.verdict, r.time_ms, r.memory_kb, r.detail, r.data_digest,
              extract(epoch FROM now() - s.leased_at)::float8 AS judging_secs
), history AS (
    INSERT INTO submission_judgings
        (submission_id, worker_id, verdict, time_ms, memory_kb, detail, lease_token, lease_gen, decided_by, data_digest,
         slot)
    SELECT id, worker_id, verdict, time_ms, memory_kb, detail, lease_token, lease_gen, 'worker', data_digest, lease_slot
    FROM decided
    RETURNING submission_id, seq
), first_pass AS (
    INSERT INTO first_passes (user_id, problem_id, submission_id)
    SELECT user_id, problem_id, id FROM decided WHERE verdict = 'AC' AND canary_expect IS NULL
    ORDER BY id
    ON CONFLICT (user_id, problem_id) DO NOTHING
    RETURNING user_id, problem_id, submission_id
), xp AS (
    UPDATE users u SET xp = u.xp + earned.reward
    FROM (SELECT fp.user_id, sum(p.xp_reward) AS reward
          FROM first_pass fp JOIN problems p ON p.id = fp.problem_id
          GROUP BY fp.user_id) earned
    WHERE u.id = earned.user_id
    RETURNING u.id
)
-- (xp runs unread: a data-modifying WITH always runs to completion)
SELECT d.id AS submission_id, d.lease_token, d.worker_id, h.seq, fp.submission_id IS NOT NULL AS xp_granted, d.judging_secs
FROM decided d JOIN history h ON h.submission_id = d.id
LEFT JOIN first_pass fp ON fp.submission_id = d.id;

-- name: find_decision_by_lease
-- read: did this lease token already decide this submission? (duplicate result)
SELECT verdict, seq, worker_id
FROM submission_judgings
WHERE submission_id = %(submission_id)s AND lease_token = %(lease_token)s AND decided_by = 'worker';

-- name: describe_lease
-- read: why a conditional write touched nothing (unknown / someone else's / gone).
SELECT id, status, worker_id, lease_token, lease_gen, lease_expires_at, lease_expires_at < now() AS expired
FROM submissions
WHERE id = %(submission_id)s;

-- name: reclaim_expired
-- arrows: judging -> pending (expired lease), judging -> system_error (expired at the last attempt).
-- A lease that was never confirmed never reached its worker: its attempt is given back.
-- Only arbiter leases (lease_token set) expire; legacy claims belong to the legacy scheme.
WITH expired AS (
    SELECT id, worker_id, lease_token
    FROM submissions
    WHERE status = 'judging' AND lease_token IS NOT NULL AND lease_expires_at < now()
    ORDER BY id
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
), reclaimed AS (
    UPDATE submissions s
    SET judge_attempts = CASE WHEN s.lease_confirmed_at IS NULL
                              THEN greatest(s.judge_attempts - 1, 0) ELSE s.judge_attempts END,
        status = CASE WHEN s.lease_confirmed_at IS NOT NULL AND s.judge_attempts >= %(max_attempts)s
                      THEN 'system_error' ELSE 'pending' END,
        judged_at = CASE WHEN s.lease_confirmed_at IS NOT NULL AND s.judge_attempts >= %(max_attempts)s
                         THEN now() END,
        worker_id = NULL,
        lease_token = NULL,
        lease_expires_at = NULL,
        lease_confirmed_at = NULL
    FROM expired
    -- A second line: `expired` locked the row FOR UPDATE, which under READ COMMITTED checks its
    -- WHERE again on the newest version (a heartbeat committed meanwhile takes it out).
    WHERE s.id = expired.id AND s.status = 'judging' AND s.lease_expires_at < now()
    RETURNING s.id, s.status, expired.worker_id AS old_worker_id,
              expired.lease_token AS old_lease_token, s.lease_gen
), history AS (
    INSERT INTO submission_judgings (submission_id, worker_id, verdict, detail, lease_token, lease_gen, decided_by)
    SELECT id, coalesce(old_worker_id, 'janitor'), 'system_error',
           jsonb_build_object('reason', 'lease expired at the last attempt'),
           old_lease_token, lease_gen, 'janitor'
    FROM reclaimed WHERE status = 'system_error'
    RETURNING submission_id
)
SELECT id, status, old_worker_id FROM reclaimed;

-- name: release_lease
-- arrows: judging -> pending (the holder hands its lease back at once: it is stopping, its sandbox will
-- not start, it cannot obtain the test data), judging -> system_error at the max_releases-th release
-- (a submission no worker can judge must not go round for ever). Fenced like a result; the attempt
-- is given back (not judging it was not the submission's doing).
WITH released AS (
    UPDATE submissions s
    SET lease_releases = s.lease_releases + 1,
        judge_attempts = greatest(s.judge_attempts - 1, 0),
        status = CASE WHEN s.lease_releases + 1 >= %(max_releases)s THEN 'system_error' ELSE 'pending' END,
        judged_at = CASE WHEN s.lease_releases + 1 >= %(max_releases)s THEN now() END,
        worker_id = NULL,
        lease_token = NULL,
        lease_expires_at = NULL,
        lease_confirmed_at = NULL
    WHERE s.id = %(submission_id)s AND s.status = 'judging'
      AND s.lease_token = %(lease_token)s AND s.worker_id = %(worker_id)s
    RETURNING s.id, s.status, s.lease_gen, s.lease_releases
), history AS (
    INSERT INTO submission_judgings (submission_id, worker_id, verdict, detail, lease_token, lease_gen, decided_by)
    SELECT id, %(worker_id)s, 'system_error',
           jsonb_build_object('reason', format('released %%s times by workers that could not judge it; last: %%s',
                                               lease_releases, %(reason)s::text)),
           %(lease_token)s, lease_gen, 'worker'
    FROM released WHERE status = 'system_error'
    RETURNING submission_id
)
SELECT id, status FROM released;

-- name: lease_horizon
-- read: the database's now() and how many seconds until the first arbiter lease expires (NULL when
-- none is live): the janitor's one look per sweep; it reclaims only when this is <= 0.
SELECT now(), extract(epoch FROM min(lease_expires_at) - now())::float8
FROM submissions WHERE status = 'judging' AND lease_token IS NOT NULL;

-- name: database_now
-- The only clock lease decisions use; the janitor compares two of its readings to notice its own absence.
SELECT now();

-- name: grant_grace_period
-- arrow: judging -> judging (extend every live lease; the arbiter's absence is not the workers' fault).
UPDATE submissions
SET lease_expires_at = greatest(lease_expires_at, now() + make_interval(secs => %(grace_secs)s))
WHERE status = 'judging' AND lease_token IS NOT NULL;

-- name: rejudge
-- arrow: terminal -> pending (new generation: every earlier token is dead).
UPDATE submissions
SET status = 'pending', lease_gen = lease_gen + 1, lease_token = NULL, worker_id = NULL,
    lease_expires_at = NULL, lease_confirmed_at = NULL, judge_attempts = 0, lease_releases = 0, judged_at = NULL
WHERE id = ANY(%(submission_ids)s)
  AND status IN ('AC', 'WA', 'TLE', 'MLE', 'RE', 'CE', 'OLE', 'system_error')
RETURNING id, lease_gen;

-- name: claimable_work
-- read: which languages have claimable work, for whom, and how much (one cheap look before
-- matching): pinned_worker NULL is anyone's work; otherwise only that worker's (a gate's canary).
-- Pending work is live work (a partial index), never the history.
SELECT language, pinned_worker, count(*) FROM submissions WHERE status = 'pending'
GROUP BY language, pinned_worker;

-- name: pinned_work
-- read: claimable_work's pinned rows alone (a pinned row is a canary: a check says so), from the
-- partial index of pending canaries: what a round that knows the unpinned work already looks at.
SELECT language, pinned_worker, count(*) FROM submissions
WHERE status = 'pending' AND canary_expect IS NOT NULL AND pinned_worker IS NOT NULL
GROUP BY language, pinned_worker;

-- name: claimable_real_languages
-- read: languages with pending real work (canaries left out): what the stuck alert watches, since a
-- canary pinned to a worker that went away is the gate's failure to report, not a stuck dispatch.
SELECT DISTINCT language FROM submissions WHERE status = 'pending' AND canary_expect IS NULL;

-- name: find_worker_credential
-- read: a worker's credential hashes for bearer authentication: the current one, and the previous
-- one with the seconds it stays valid (DB time; NULL once its overlap is over).
SELECT worker_id, kind, languages, slots, secret_sha256, revoked_at IS NOT NULL AS revoked,
       CASE WHEN previous_secret_until > now() THEN previous_secret_sha256 END AS previous_secret_sha256,
       CASE WHEN previous_secret_until > now()
            THEN extract(epoch FROM previous_secret_until - now())::float END AS previous_valid_secs
FROM workers WHERE worker_id = %(worker_id)s;

-- name: touch_worker
UPDATE workers SET last_seen_at = now() WHERE worker_id = %(worker_id)s
  AND (last_seen_at IS NULL OR last_seen_at < now() - interval '1 second');

-- name: touch_workers
-- The workers whose cached credentials requests presented since the last time (a few seconds): one
-- statement for many of them, not one per request. It never waits for a row lock (SKIP LOCKED: a
-- worker whose row a grant holds is marked the next time), so beside acquire_leases, which updates
-- several workers' rows too, no lock cycle can form; the caller sends at most a few hundred at a
-- time, so a grant waits for this no longer than a few milliseconds.
UPDATE workers SET last_seen_at = now()
WHERE worker_id IN (
    SELECT worker_id FROM workers
    WHERE worker_id = ANY(%(worker_ids)s)
      AND (last_seen_at IS NULL OR last_seen_at < now() - interval '1 second')
    FOR UPDATE SKIP LOCKED
);

-- name: worker_fairness_order
-- read: when each worker last got a lease (round-robin fairness is rebuilt from the table).
SELECT worker_id, last_lease_at FROM workers WHERE worker_id = ANY(%(worker_ids)s);

-- name: dispatch_tables_present
-- The schema the dispatcher follows, in one look: the legacy scheme's tables (stages 1-3) and the
-- stage-4 schema's paused workers (005_worker_pauses).
SELECT to_regclass('judge_dispatch_state') IS NOT NULL AS legacy, to_regclass('worker_pauses') IS NOT NULL AS pauses;

-- name: worker_pauses_present
-- The stage-4 schema's table of paused workers (005_worker_pauses); stages 2-3 run without it.
SELECT to_regclass('worker_pauses') IS NOT NULL AS present;

-- name: paused_workers
-- read: the workers the operator paused (judgectl worker pause): a dispatch round grants them nothing.
SELECT worker_id FROM worker_pauses;

-- name: legacy_take_global_lock
-- The legacy global lock, honoured by the arbiter while the legacy scheme coexists (stages 2-3).
SELECT rr_last_home FROM judge_dispatch_state WHERE id = 1 FOR UPDATE;

-- name: legacy_turn_is_elsewhere
-- read, under the legacy global lock: must this parked arbiter worker let a legacy worker go first?
-- The legacy yield rules (production yields while a home worker is idle; home workers take turns by
-- the round-robin pointer), where only legacy workers are yielded to: the arbiter orders its own
-- parked workers itself. Only while the oldest work this worker could take is younger than
-- yield_secs, so a legacy worker that does not take it delays it by that much at most.
WITH idle_homes AS (
    SELECT worker_id FROM judge_nodes
    WHERE kind = 'home' AND idle AND last_seen > now() - make_interval(secs => %(fresh_secs)s)
), next_home AS (
    SELECT coalesce(
        (SELECT min(worker_id) FROM idle_homes
         WHERE %(rr_last_home)s::text IS NULL OR worker_id > %(rr_last_home)s::text),
        (SELECT min(worker_id) FROM idle_homes)) AS worker_id
), legacy_idle AS (
    SELECT worker_id FROM idle_homes WHERE NOT worker_id = ANY(%(arbiter_workers)s::text[])
), oldest_claimable AS (
    SELECT created_at FROM submissions
    WHERE status = 'pending' AND language = ANY(%(languages)s::text[])
      AND (pinned_worker IS NULL OR pinned_worker = %(worker_id)s)
    ORDER BY id LIMIT 1
)
SELECT CASE WHEN %(kind)s = 'production' THEN EXISTS (SELECT 1 FROM legacy_idle)
            ELSE EXISTS (SELECT 1 FROM legacy_idle WHERE worker_id = (SELECT worker_id FROM next_home))
       END
   -- a canary pinned to this worker is nobody else's turn
   AND NOT EXISTS (SELECT 1 FROM submissions WHERE status = 'pending' AND canary_expect IS NOT NULL
                   AND pinned_worker = %(worker_id)s AND language = ANY(%(languages)s::text[]))
   AND coalesce((SELECT created_at > now() - make_interval(secs => %(yield_secs)s) FROM oldest_claimable),
                false) AS yield_turn;

-- name: legacy_note_claim
-- Keep the shared round-robin row and the node table as legacy workers expect them.
WITH node AS (
    INSERT INTO judge_nodes (worker_id, kind, idle, last_seen)
    VALUES (%(worker_id)s, %(kind)s, false, now())
    ON CONFLICT (worker_id) DO UPDATE SET idle = false, last_seen = now(), kind = EXCLUDED.kind
    RETURNING worker_id
)
UPDATE judge_dispatch_state
SET rr_last_home = CASE WHEN %(kind)s = 'home' THEN %(worker_id)s ELSE rr_last_home END,
    updated_at = now()
WHERE id = 1 AND EXISTS (SELECT 1 FROM node);

-- name: legacy_mark_idle
-- Parked arbiter workers are idle: legacy production workers yield to idle home workers.
INSERT INTO judge_nodes (worker_id, kind, idle, last_seen)
SELECT w, k, true, now() FROM unnest(%(worker_ids)s::text[], %(kinds)s::text[]) AS t(w, k)
ON CONFLICT (worker_id) DO UPDATE SET idle = true, last_seen = now(), kind = EXCLUDED.kind;

-- Canaries: known programs with a known expected verdict on the built-in problem 'judge-canary',
-- judged through every arrow a real submission takes and credited to nobody (docs/architecture.md).

-- name: submit_canary
-- arrow: (none) -> pending, a canary; pinned_worker NULL: any worker may take it. Its user and its
-- problem (the sum of two integers; test data ships with the worker package) are made by the first
-- canary, so a site that never runs one has neither.
WITH canary_user AS (
    INSERT INTO users (name) VALUES ('judge-canary')
    ON CONFLICT (name) DO UPDATE SET name = EXCLUDED.name
    RETURNING id
), canary_problem AS (
    INSERT INTO problems (slug, title, xp_reward, time_limit_ms, memory_limit_kb)
    VALUES ('judge-canary', 'Canary: the sum of two integers (built in)', 0, 2000, 131072)
    ON CONFLICT (slug) DO UPDATE SET slug = EXCLUDED.slug
    RETURNING id
), inserted AS (
    INSERT INTO submissions (user_id, problem_id, language, source, canary_expect, pinned_worker)
    SELECT u.id, p.id, %(language)s, %(source)s, %(expect)s, %(pinned_worker)s
    FROM canary_user u, canary_problem p
    RETURNING id, pinned_worker
)
-- A pinned canary tells the dispatcher so ('pinned'): a round that goes by the work it knows reads
-- the pinned canaries again only when told (arbiter/server/loops/dispatcher.py _look).
SELECT id, (SELECT pg_notify('submission_pending', 'pinned') WHERE pinned_worker IS NOT NULL) FROM inserted;

-- name: withdraw_canary
-- arrow: pending -> system_error, for a canary nobody took in time: it must not linger in the
-- queue pinned to a worker that may never come back.
UPDATE submissions SET status = 'system_error', judged_at = now()
WHERE id = %(submission_id)s AND canary_expect IS NOT NULL AND status = 'pending'
RETURNING id;

-- name: canary_outcome
-- read: where a canary stands and, once decided, who decided it and through which transport (the
-- history row carries a lease token when the arbiter's lease decided it; to_jsonb reads the row
-- whatever the schema's stage, so this works before stage 1 too).
SELECT s.status, s.canary_expect, s.worker_id, s.pinned_worker, s.language,
       j.worker_id AS judged_by, j.detail, (to_jsonb(j) ->> 'lease_token') IS NOT NULL AS via_arbiter,
       extract(epoch FROM s.leased_at - s.created_at)::float AS queued_s,
       extract(epoch FROM s.judged_at - s.leased_at)::float AS judging_s,
       extract(epoch FROM coalesce(s.judged_at, now()) - s.created_at)::float AS total_s,
       extract(epoch FROM s.judged_at)::float AS decided_at
FROM submissions s
LEFT JOIN LATERAL (SELECT * FROM submission_judgings WHERE submission_id = s.id ORDER BY id DESC LIMIT 1) j
    ON s.status NOT IN ('pending', 'judging')
WHERE s.id = %(submission_id)s AND s.canary_expect IS NOT NULL;

-- name: open_probe_canaries
-- read: the standing probe's canaries (unpinned) not yet decided, oldest first.
SELECT id FROM submissions
WHERE canary_expect IS NOT NULL AND pinned_worker IS NULL AND status IN ('pending', 'judging')
ORDER BY id;

-- name: last_probe_success
-- read: when (DB time, Unix seconds) a probe canary last got its expected verdict; NULL if never.
SELECT extract(epoch FROM max(judged_at))::float FROM submissions
WHERE canary_expect IS NOT NULL AND pinned_worker IS NULL AND status = canary_expect;

-- name: old_canaries
-- read, locking: decided canaries older than keep_secs, except each worker's last one (the status
-- page shows it). The three forget_* statements below then remove them in one transaction.
WITH last_per_worker AS (
    SELECT max(id) AS id FROM submissions
    WHERE canary_expect IS NOT NULL AND status NOT IN ('pending', 'judging')
    GROUP BY worker_id
)
SELECT id FROM submissions
WHERE canary_expect IS NOT NULL AND status NOT IN ('pending', 'judging')
  AND judged_at < now() - make_interval(secs => %(keep_secs)s)
  AND id NOT IN (SELECT id FROM last_per_worker)
ORDER BY id
LIMIT %(batch)s
FOR UPDATE SKIP LOCKED;

-- name: forget_canary_history
-- A canary's history rows: the one exception the append-only trigger allows (it checks that the
-- submission is a canary, so this runs before the canaries themselves go).
DELETE FROM submission_judgings WHERE submission_id = ANY(%(submission_ids)s);

-- name: forget_canary_grants
DELETE FROM lease_grants WHERE submission_id = ANY(%(submission_ids)s);

-- name: forget_canaries
-- arrow: decided canary -> gone.
DELETE FROM submissions WHERE id = ANY(%(submission_ids)s)
  AND canary_expect IS NOT NULL AND status NOT IN ('pending', 'judging')
RETURNING id;

-- name: data_set_files
-- read: the files of a test-data set (its digest), for a worker fetching it.
SELECT path, size, sha256 FROM test_data_files WHERE digest = %(digest)s ORDER BY path;

-- name: blob_size
-- read: a stored test-data file's size (NULL: not stored).
SELECT size FROM test_blobs WHERE sha256 = %(sha256)s;

-- name: blob_chunk
-- read: one chunk of a stored test-data file.
SELECT data FROM test_blob_chunks WHERE sha256 = %(sha256)s AND seq = %(seq)s;

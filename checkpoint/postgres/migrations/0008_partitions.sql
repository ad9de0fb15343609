-- Partitions of a batch step split across runners (steps.Partitions):
-- recorded once with the step's running checkpoint, never recomputed. A
-- partition has its own fence, raised by every claim (FOR UPDATE SKIP
-- LOCKED); its chunk transactions begin with stepwise_partition_fence,
-- which updates its row WHERE fence = the holder's (the progress and
-- heartbeat in one, its row lock held to the commit). key_from/key_to
-- bound a range rule's keys ([from, to), to '' unbounded); a hash rule
-- assigns by the job's PartitionBy value. Leases are on the server's
-- clock.
CREATE TABLE partitions (
    run_id      text COLLATE "C" NOT NULL,
    step_id     text COLLATE "C" NOT NULL,
    idx         integer NOT NULL,
    count       integer NOT NULL,
    rule        text NOT NULL CHECK (rule IN ('range', 'hash')),
    key_from    text COLLATE "C" NOT NULL DEFAULT '',
    key_to      text COLLATE "C" NOT NULL DEFAULT '',
    state       text NOT NULL CHECK (state IN ('pending', 'running', 'done', 'failed')),
    owner       text NOT NULL DEFAULT '',
    fence       bigint NOT NULL DEFAULT 0,
    lease_until timestamptz,
    high_water  text COLLATE "C" NOT NULL DEFAULT '',
    done        bigint NOT NULL DEFAULT 0,
    rejected    bigint NOT NULL DEFAULT 0,
    skipped     bigint NOT NULL DEFAULT 0,
    executed    bigint NOT NULL DEFAULT 0,
    total       bigint NOT NULL DEFAULT -1,
    error       text NOT NULL DEFAULT '',
    updated_at  timestamptz NOT NULL,
    PRIMARY KEY (run_id, step_id, idx)
);

CREATE INDEX partitions_claimable ON partitions (state, lease_until);

-- stepwise_partition_fence is a partition write's first statement: it
-- extends the partition's lease where the partition is still at the
-- holder's fence, running, of a running run, and keeps the row locked
-- until the commit (a claim skips or waits for it). It locks the running
-- run's row FOR KEY SHARE to the commit as well, as stepwise_fence does,
-- so an operator action or a claim of the run (FOR UPDATE) waits for a
-- chunk in flight: a reset cannot delete a step's items and partitions
-- while a chunk of it is still to commit its own. Otherwise it raises
-- SWF03 saying why (claimed since, no longer running, reset).
CREATE FUNCTION stepwise_partition_fence(p_run text, p_step text, p_idx integer, p_held bigint, p_lease_us bigint, p_at timestamptz)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    p record;
BEGIN
    PERFORM 1 FROM runs WHERE id = p_run AND status = 'running' FOR KEY SHARE;
    IF FOUND THEN
        UPDATE partitions SET lease_until = coalesce(p_at, now()) + p_lease_us * interval '1 microsecond',
            updated_at = coalesce(p_at, now())
        WHERE run_id = p_run AND step_id = p_step AND idx = p_idx AND fence = p_held AND state = 'running';
        IF FOUND THEN
            RETURN p_held;
        END IF;
    END IF;
    SELECT * INTO p FROM partitions WHERE run_id = p_run AND step_id = p_step AND idx = p_idx;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'SWF03',
            MESSAGE = format('partition %s of %s of run %s is no longer recorded (the step was reset)', p_idx, p_step, p_run);
    ELSIF p.fence <> p_held THEN
        RAISE EXCEPTION USING ERRCODE = 'SWF03',
            MESSAGE = format('partition %s of %s of run %s is at fence %s (held by %s), this holder has fence %s',
                p_idx, p_step, p_run, p.fence, split_part(p.owner, ' ', 1), p_held);
    ELSIF p.state <> 'running' THEN
        RAISE EXCEPTION USING ERRCODE = 'SWF03',
            MESSAGE = format('partition %s of %s of run %s is %s', p_idx, p_step, p_run, p.state);
    END IF;
    RAISE EXCEPTION USING ERRCODE = 'SWF03',
        MESSAGE = format('run %s is no longer running; partition %s of %s', p_run, p_idx, p_step);
END
$$;

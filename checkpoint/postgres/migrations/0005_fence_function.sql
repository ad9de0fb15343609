-- The fence check of a write transaction as one function, so that a lone
-- checkpoint write can go to the server in one round trip: a batch of
-- [SELECT stepwise_fence(...), the writes] sent outside BEGIN/COMMIT runs
-- as one implicit transaction (one Sync), and an error in any statement
-- rolls all of it back. The store's own raised errors use SQLSTATE class
-- SW, which PostgreSQL does not define.

-- stepwise_fence locks the run row FOR KEY SHARE (a claim's FOR UPDATE
-- waits for the transaction that holds it) and returns its fence. A run at
-- another fence raises SWF01, its fence in DETAIL; a missing run raises
-- SWF02. Names resolve through the caller's search_path, like every other
-- statement of the store.
CREATE FUNCTION stepwise_fence(run text, held bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    at_fence bigint;
BEGIN
    SELECT r.fence INTO at_fence FROM runs AS r WHERE r.id = run FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'SWF02',
            MESSAGE = format('run %s does not exist', run);
    END IF;
    IF at_fence <> held THEN
        RAISE EXCEPTION USING ERRCODE = 'SWF01',
            MESSAGE = format('run %s is at fence %s, this attempt holds fence %s', run, at_fence, held),
            DETAIL = at_fence::text;
    END IF;
    RETURN at_fence;
END
$$;

-- stepwise_expect_rows raises SWR01 when a write changed another number of
-- rows than it must: a checkpoint write refused (the step or an item is
-- already finished) aborts the batch it is in, which the store then runs
-- again statement by statement to say why.
CREATE FUNCTION stepwise_expect_rows(got bigint, want bigint, what text) RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    IF got <> want THEN
        RAISE EXCEPTION USING ERRCODE = 'SWR01',
            MESSAGE = format('%s: wrote %s of %s rows', what, got, want);
    END IF;
    RETURN got;
END
$$;

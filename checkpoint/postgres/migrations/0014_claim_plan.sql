-- The claim's plan, independent of statistics. On a queue just filled and
-- never analysed the planner guesses that a handful of rows match (the
-- default selectivities), so it read the runs of the worker's jobs
-- through runs_job, sorted every due run and took the first: a full sort
-- per claim, 0.42 times the rate of the plan it picks after ANALYZE.
-- stepwise_claim_candidates is the claim's pick, with the planner's
-- other paths priced out for that statement only (the SET clauses last
-- while the function runs): it always walks runs_queue in claim order
-- (priority DESC, available_at, id) and stops after n rows it can lock.
-- Its arguments: the claim's time, the queues and jobs it takes (empty:
-- all), the limits found full by this claim already, and how many runs
-- at most ($1 to $5 in the query, which a test explains as it stands).
-- PL/pgSQL, so each connection plans the query once, not at every call.
-- Locked rows stay locked until the caller's transaction ends.
CREATE FUNCTION stepwise_claim_candidates(at timestamptz, queues text[], jobs text[], full_limits text[], n integer)
RETURNS SETOF runs
LANGUAGE plpgsql VOLATILE ROWS 4
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_sort = off
SET enable_hashjoin = off SET enable_mergejoin = off
AS $$ BEGIN RETURN QUERY
SELECT * FROM runs
WHERE queue IS NOT NULL AND status IN ('queued', 'interrupted', 'running')
  AND ((status IN ('queued', 'interrupted') AND available_at <= $1) OR (status = 'running' AND lease_until <= $1))
  AND (cardinality($2) = 0 OR queue = ANY ($2))
  AND (cardinality($3) = 0 OR job = ANY ($3))
  AND (limit_key IS NULL OR (NOT limit_key = ANY ($4) AND limit_max > (SELECT count(*) FROM runs h
      WHERE h.limit_key = runs.limit_key AND h.status = 'running' AND h.lease_until > $1 AND h.id <> runs.id)))
ORDER BY priority DESC, available_at, id
LIMIT $5
FOR UPDATE SKIP LOCKED;
END $$;

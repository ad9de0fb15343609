-- The run queue and concurrency limits (checkpoint/sqlite's migration
-- 0009). A run enqueued for a pool of workers has a queue (NULL for a run
-- started directly, which ClaimNext never takes), a priority (higher
-- first) and the time it becomes available; a run counts against the
-- limit limit_key (NULL: none), which allows limit_max runs with a live
-- lease at once. Limit checks serialise on a transaction-level advisory
-- lock of the key.
ALTER TABLE runs ADD COLUMN queue text COLLATE "C";
ALTER TABLE runs ADD COLUMN priority integer NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN available_at timestamptz;
ALTER TABLE runs ADD COLUMN limit_key text COLLATE "C";
ALTER TABLE runs ADD COLUMN limit_max integer NOT NULL DEFAULT 0;
-- ClaimNext's order over the runs it may take.
CREATE INDEX runs_queue ON runs (priority DESC, available_at, id)
    WHERE queue IS NOT NULL AND status IN ('queued', 'interrupted', 'running');
-- The live holders of a limit.
CREATE INDEX runs_limit ON runs (limit_key, lease_until)
    WHERE limit_key IS NOT NULL AND status = 'running';

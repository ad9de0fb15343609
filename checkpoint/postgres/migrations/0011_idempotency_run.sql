-- Prune deletes the Idempotency-Keys of the runs it prunes (SQLite's
-- 0013_idempotency_run.sql): this index finds the pruned runs' keys
-- without reading every key ever recorded.
CREATE INDEX idempotency_keys_run ON idempotency_keys (run_id);

-- Prune deletes the Idempotency-Keys of the runs it prunes (their run
-- keys stay as tombstones and answer a start with the old key): this
-- index finds a run's keys without reading every key ever recorded.
CREATE INDEX idempotency_keys_run ON idempotency_keys (run_id);

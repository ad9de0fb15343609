-- An outside call step (steps.Call) records, with its intent, its
-- idempotency key and the shape of its output (JSON), and later an
-- operator's resolution: operations refuse to clear a call that happened
-- without --force, and check a resolved output against the shape.
ALTER TABLE steps ADD COLUMN call_record bytea;

-- The effect plan of a step (relative operations and the compare-and-set
-- writes computed from them), recorded with its checkpoint.
ALTER TABLE steps ADD COLUMN plan BLOB;

-- The built-in key/value target: durable counters for jobs that need no
-- table of their own. Versions only grow.
CREATE TABLE stepwise_state (
    key     TEXT PRIMARY KEY,
    value   INTEGER NOT NULL,
    version INTEGER NOT NULL
) WITHOUT ROWID;

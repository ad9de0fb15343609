-- Partitions of a batch step split across runners (steps.Partitions):
-- recorded once with the step's running checkpoint, never recomputed. A
-- partition has its own fence, raised by every claim; its chunk
-- transactions begin by updating its row WHERE fence = the holder's (the
-- progress and heartbeat in one). key_from/key_to bound a range rule's
-- keys ([from, to), to '' unbounded); a hash rule assigns by the job's
-- PartitionBy value. Counters are absolute, as the partition's last pass
-- saw them.
CREATE TABLE partitions (
    run_id      TEXT NOT NULL,
    step_id     TEXT NOT NULL,
    idx         INTEGER NOT NULL,
    count       INTEGER NOT NULL,
    rule        TEXT NOT NULL CHECK (rule IN ('range', 'hash')),
    key_from    TEXT NOT NULL DEFAULT '',
    key_to      TEXT NOT NULL DEFAULT '',
    state       TEXT NOT NULL CHECK (state IN ('pending', 'running', 'done', 'failed')),
    owner       TEXT NOT NULL DEFAULT '',
    fence       INTEGER NOT NULL DEFAULT 0,
    lease_until TEXT,
    high_water  TEXT NOT NULL DEFAULT '',
    done        INTEGER NOT NULL DEFAULT 0,
    rejected    INTEGER NOT NULL DEFAULT 0,
    skipped     INTEGER NOT NULL DEFAULT 0,
    executed    INTEGER NOT NULL DEFAULT 0,
    total       INTEGER NOT NULL DEFAULT -1,
    error       TEXT NOT NULL DEFAULT '',
    updated_at  TEXT NOT NULL,
    PRIMARY KEY (run_id, step_id, idx)
) WITHOUT ROWID;

-- Claims look for pending and lease-expired partitions.
CREATE INDEX partitions_claimable ON partitions (state, lease_until);

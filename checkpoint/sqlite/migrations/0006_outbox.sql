-- Notifications queued by steps in the same transaction as their
-- checkpoints, delivered at least once by a dispatcher with their stable
-- key (deduplicable downstream).
CREATE TABLE outbox (
    key        TEXT PRIMARY KEY,            -- RUN_ID/STEP_ID: the same on every rerun
    run_id     TEXT NOT NULL,
    topic      TEXT NOT NULL,
    payload    BLOB NOT NULL,               -- JSON
    status     TEXT NOT NULL,               -- queued|sent
    tries      INTEGER NOT NULL DEFAULT 0,
    next_at    TEXT NOT NULL,               -- not before this time
    last_error TEXT NOT NULL DEFAULT '',
    created_at TEXT NOT NULL,
    sent_at    TEXT
) WITHOUT ROWID;
CREATE INDEX outbox_due ON outbox (status, next_at);

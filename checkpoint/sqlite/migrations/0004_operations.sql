-- Manual operations on runs (recover, rerun, reset, abandon, prune, ...):
-- who did what, when and why. Settlement operators are audited.
CREATE TABLE audit (
    id       INTEGER PRIMARY KEY,
    run_id   TEXT NOT NULL,
    at       TEXT NOT NULL,
    operator TEXT NOT NULL,
    command  TEXT NOT NULL,
    reason   TEXT NOT NULL DEFAULT '',
    details  TEXT NOT NULL DEFAULT ''
);
CREATE INDEX audit_run ON audit (run_id, id);

-- A pruned run keeps its row as a tombstone: its key is never run again.
ALTER TABLE runs ADD COLUMN pruned_at TEXT;

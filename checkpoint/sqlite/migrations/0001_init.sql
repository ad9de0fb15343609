-- Runs: one row per (job, run key); never a second row for the same key.
CREATE TABLE runs (
    id          TEXT PRIMARY KEY,          -- job/run-key, e.g. report/2026-11-28
    job         TEXT NOT NULL,
    run_key     TEXT NOT NULL,
    params      TEXT NOT NULL,             -- canonical JSON of the parameters
    params_hash TEXT NOT NULL,             -- sha256 of params
    status      TEXT NOT NULL,             -- running|succeeded|failed|interrupted|abandoned
    fence       INTEGER NOT NULL,          -- grows on every claim
    lease_owner TEXT,                      -- host:pid while running
    lease_until TEXT,                      -- RFC 3339 UTC, fixed width
    error       TEXT NOT NULL DEFAULT '',
    created_at  TEXT NOT NULL,
    updated_at  TEXT NOT NULL,
    finished_at TEXT
);
CREATE INDEX runs_job ON runs (job, created_at);

-- Attempts: one row per claim of a run (first try, resume, rerun).
CREATE TABLE attempts (
    run_id      TEXT NOT NULL REFERENCES runs (id),
    number      INTEGER NOT NULL,
    fence       INTEGER NOT NULL,
    owner       TEXT NOT NULL,             -- host:pid
    status      TEXT NOT NULL,             -- running|succeeded|failed|interrupted|lost
    error       TEXT NOT NULL DEFAULT '',
    started_at  TEXT NOT NULL,
    finished_at TEXT,
    PRIMARY KEY (run_id, number)
) WITHOUT ROWID;

-- Step checkpoints: the durable result of each step of a run.
CREATE TABLE steps (
    run_id      TEXT NOT NULL,
    step_id     TEXT NOT NULL,             -- deterministic: name or name/key
    status      TEXT NOT NULL,             -- completed|rejected|failed
    output      BLOB,                      -- JSON
    input_hash  TEXT NOT NULL DEFAULT '',
    error       TEXT NOT NULL DEFAULT '',
    tries       INTEGER NOT NULL DEFAULT 1,
    attempt     INTEGER NOT NULL,
    started_at  TEXT NOT NULL,
    finished_at TEXT NOT NULL,
    PRIMARY KEY (run_id, step_id)
) WITHOUT ROWID;

-- The PostgreSQL form of the SQLite schema (checkpoint/sqlite's migrations
-- 0001 to 0007, folded): the same tables, columns and meanings.
--
-- Identifiers (run, step and item keys, effect IDs) use COLLATE "C", so
-- they compare and sort bytewise as on SQLite, whatever the database's
-- default collation: the key range reads that skip finished items mean the
-- same on both stores. Money, values, versions and fences are bigint. Times
-- are timestamptz (NULL where SQLite stores ''). Outputs, plans, payloads
-- and fingerprints are bytea: the store gives back exactly the bytes it was
-- given, which the content-decides-conflict rule compares (jsonb would
-- reorder keys and drop whitespace and duplicates, and an output need not
-- be JSON). Params stay text: they are canonical JSON, read in psql.

-- Runs: one row per (job, run key); never a second row for the same key.
CREATE TABLE runs (
    id          text COLLATE "C" PRIMARY KEY,   -- job/run-key, e.g. report/2026-11-28
    job         text COLLATE "C" NOT NULL,
    run_key     text COLLATE "C" NOT NULL,
    params      text NOT NULL,                  -- canonical JSON of the parameters
    params_hash text NOT NULL,                  -- sha256 of params
    status      text NOT NULL,                  -- running|succeeded|failed|interrupted|abandoned
    fence       bigint NOT NULL,                -- grows on every claim
    lease_owner text,                           -- host:pid while running
    lease_until timestamptz,                    -- on the database clock
    error       text NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL,
    finished_at timestamptz,
    pruned_at   timestamptz                     -- a pruned run keeps its row as a tombstone
);
CREATE INDEX runs_job ON runs (job, created_at);
CREATE INDEX runs_created ON runs (created_at DESC, id);

-- Attempts: one row per claim of a run (first try, resume, rerun).
CREATE TABLE attempts (
    run_id      text COLLATE "C" NOT NULL REFERENCES runs (id),
    number      integer NOT NULL,
    fence       bigint NOT NULL,
    owner       text NOT NULL,                  -- host:pid
    status      text NOT NULL,                  -- running|succeeded|failed|interrupted|lost
    error       text NOT NULL DEFAULT '',
    started_at  timestamptz NOT NULL,
    finished_at timestamptz,
    PRIMARY KEY (run_id, number)
);

-- Step checkpoints: the durable result of each step of a run.
CREATE TABLE steps (
    run_id      text COLLATE "C" NOT NULL,
    step_id     text COLLATE "C" NOT NULL,      -- deterministic: name or name/key
    status      text NOT NULL,                  -- completed|rejected|failed|planned|calling|running
    output      bytea,                          -- encoded output (JSON)
    input_hash  text NOT NULL DEFAULT '',
    error       text NOT NULL DEFAULT '',
    tries       integer NOT NULL DEFAULT 1,
    attempt     integer NOT NULL,
    started_at  timestamptz,
    finished_at timestamptz,
    plan        bytea,                          -- the step's effect plan (JSON)
    PRIMARY KEY (run_id, step_id)
);

-- The built-in key/value target: durable counters for jobs that need no
-- table of their own. Versions only grow.
CREATE TABLE stepwise_state (
    key     text COLLATE "C" PRIMARY KEY,
    value   bigint NOT NULL,
    version bigint NOT NULL
);

-- Effect IDs of plans applied to a target table of this database, written
-- in the transaction that applies them: the only proof that a plan of ours
-- applied. (SQLite creates it beside the first target table opened.)
CREATE TABLE stepwise_applied (
    effect_id  text COLLATE "C" PRIMARY KEY,
    run_id     text COLLATE "C" NOT NULL,
    step_id    text COLLATE "C" NOT NULL,
    applied_at timestamptz NOT NULL
);

-- Manual operations on runs (recover, rerun, reset, abandon, prune, ...):
-- who did what, when and why. Settlement operators are audited.
CREATE TABLE audit (
    id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id   text COLLATE "C" NOT NULL,
    at       timestamptz NOT NULL,
    operator text NOT NULL,
    command  text NOT NULL,
    reason   text NOT NULL DEFAULT '',
    details  text NOT NULL DEFAULT ''
);
CREATE INDEX audit_run ON audit (run_id, id);

-- Schedules: one row per schedule, holding what a scheduler needs after a
-- restart and the lease that lets only one scheduler fire it.
--
-- last_fire is the settle mark: every fire of the schedule up to it has been
-- decided (its run started and ended, or it was skipped on purpose), so
-- after downtime the fires after it are the missed ones. It never moves back.
CREATE TABLE schedules (
    name        text COLLATE "C" PRIMARY KEY,
    last_fire   timestamptz NOT NULL,
    fence       bigint NOT NULL,                -- grows on every claim of the lease
    lease_owner text,                           -- host:pid of the scheduler firing it
    lease_until timestamptz,                    -- NULL once released
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL
);

-- Notifications queued by steps in the same transaction as their
-- checkpoints, delivered at least once by a dispatcher with their stable
-- key (deduplicable downstream).
CREATE TABLE outbox (
    key        text COLLATE "C" PRIMARY KEY,    -- RUN_ID/STEP_ID: the same on every rerun
    run_id     text COLLATE "C" NOT NULL,
    topic      text NOT NULL,
    payload    bytea NOT NULL,                  -- JSON
    status     text NOT NULL,                   -- queued|sent
    tries      integer NOT NULL DEFAULT 0,
    next_at    timestamptz NOT NULL,            -- not before this time
    last_error text NOT NULL DEFAULT '',
    created_at timestamptz NOT NULL,
    sent_at    timestamptz
);
CREATE INDEX outbox_due ON outbox (status, next_at);
CREATE INDEX outbox_run ON outbox (run_id, created_at);

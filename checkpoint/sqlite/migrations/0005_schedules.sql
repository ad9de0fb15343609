-- Schedules: one row per schedule, holding what a scheduler needs after a
-- restart and the lease that lets only one scheduler fire it.
--
-- last_fire is the settle mark: every fire of the schedule up to it has been
-- decided (its run started and ended, or it was skipped on purpose), so
-- after downtime the fires after it are the missed ones. It never moves back.
CREATE TABLE schedules (
    name        TEXT PRIMARY KEY,
    last_fire   TEXT NOT NULL,             -- RFC 3339 UTC, fixed width
    fence       INTEGER NOT NULL,          -- grows on every claim of the lease
    lease_owner TEXT,                      -- host:pid of the scheduler firing it
    lease_until TEXT,                      -- NULL once released
    created_at  TEXT NOT NULL,
    updated_at  TEXT NOT NULL
) WITHOUT ROWID;

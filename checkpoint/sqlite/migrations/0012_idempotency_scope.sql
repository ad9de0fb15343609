-- Idempotency-Keys are scoped per API caller: scope is whose key it is
-- (httpapi records "token:NAME" for a token's requests, its bearer and
-- its cookie session alike), and a key is recorded, replayed and refused
-- within its scope only, so two callers that pick the same key make two
-- independent requests and neither sees the other's answer. The primary
-- key becomes (scope, key); SQLite cannot change a primary key in place,
-- so the table is copied. The keys recorded before this migration get the
-- empty scope, which no caller has: they replay to nobody (whose they
-- were is not known), and a retry of one is answered by the run key its
-- run ID is made of, as a start without a key is.
CREATE TABLE idempotency_keys_scoped (
    scope        TEXT NOT NULL,
    key          TEXT NOT NULL,
    request_hash TEXT NOT NULL,
    job          TEXT NOT NULL,
    params       TEXT NOT NULL,
    run_id       TEXT NOT NULL,
    state        TEXT NOT NULL CHECK (state IN ('accepting', 'done')),
    holder       TEXT NOT NULL,
    created_at   TEXT NOT NULL,
    updated_at   TEXT NOT NULL,
    PRIMARY KEY (scope, key)
) WITHOUT ROWID;
INSERT INTO idempotency_keys_scoped
    (scope, key, request_hash, job, params, run_id, state, holder, created_at, updated_at)
SELECT '', key, request_hash, job, params, run_id, state, holder, created_at, updated_at
FROM idempotency_keys;
DROP TABLE idempotency_keys;
ALTER TABLE idempotency_keys_scoped RENAME TO idempotency_keys;

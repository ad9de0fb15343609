-- The Idempotency-Keys of the API requests that started runs (POST
-- /api/v1/runs): a replay of a key, even after a restart, answers with the
-- run it named; the key reused for another request (request_hash) is
-- refused. state is 'accepting' while the first request creates its run,
-- then 'done'. holder is the token of the request accepting it (a new one
-- each begin, a takeover included): only that request may finish or drop
-- it.
CREATE TABLE idempotency_keys (
    key          TEXT PRIMARY KEY,
    request_hash TEXT NOT NULL,
    job          TEXT NOT NULL,
    params       TEXT NOT NULL,
    run_id       TEXT NOT NULL,
    state        TEXT NOT NULL CHECK (state IN ('accepting', 'done')),
    holder       TEXT NOT NULL,
    created_at   TEXT NOT NULL,
    updated_at   TEXT NOT NULL
) WITHOUT ROWID;

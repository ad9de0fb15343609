-- The Idempotency-Keys of the API requests that started runs (SQLite's
-- 0011_idempotency_keys.sql): a replay of a key, even after a restart,
-- answers with the run it named; the key reused for another request
-- (request_hash) is refused. state is 'accepting' while the first request
-- creates its run, then 'done'. holder is the token of the request
-- accepting it (a new one each begin, a takeover included): only that
-- request may finish or drop it.
CREATE TABLE idempotency_keys (
    key          text COLLATE "C" PRIMARY KEY,
    request_hash text NOT NULL,
    job          text NOT NULL,
    params       text NOT NULL,
    run_id       text COLLATE "C" NOT NULL,
    state        text NOT NULL CHECK (state IN ('accepting', 'done')),
    holder       text NOT NULL,
    created_at   timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL
);

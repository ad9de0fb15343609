-- Changes to a batch step's source found by a rerun, and the operator's
-- decisions on them (SQLite's 0008_item_changes.sql). A rerun that finds a
-- finished item changed (or gone, or new beyond the declared total)
-- records the changes its refusal names as 'refused'; an acceptance
-- accepts exactly those rows, matched by key, kind of change and the
-- fingerprint the refusal saw, and marks them 'accepted' with the
-- operator. item_key is '' for finished items that could not be named;
-- items counts them.
CREATE TABLE item_changes (
    run_id      text COLLATE "C" NOT NULL,
    step_id     text COLLATE "C" NOT NULL,
    item_key    text COLLATE "C" NOT NULL,
    change      text NOT NULL,
    fingerprint bytea,
    items       bigint NOT NULL DEFAULT 1,
    status      text NOT NULL CHECK (status IN ('refused', 'accepted')),
    attempt     integer NOT NULL,
    at          timestamptz NOT NULL,
    operator    text NOT NULL DEFAULT '',
    PRIMARY KEY (run_id, step_id, item_key)
);

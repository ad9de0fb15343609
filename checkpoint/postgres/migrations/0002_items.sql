-- Item checkpoints of batch (ForEach) steps: one row per item, written a
-- chunk at a time. Kept apart from steps so a run's few steps load in one
-- small query and a million items never do.
CREATE TABLE items (
    run_id      text COLLATE "C" NOT NULL,
    step_id     text COLLATE "C" NOT NULL,      -- the ForEach step's name
    item_key    text COLLATE "C" NOT NULL,      -- the item's business key
    status      text NOT NULL,                  -- completed|rejected|skipped|planned
    output      bytea,                          -- JSON
    error       text NOT NULL DEFAULT '',
    attempt     integer NOT NULL,
    chunk       text COLLATE "C" NOT NULL DEFAULT '', -- separate store: the chunk plan's effect ID
    -- 16 bytes of SHA-256 of the item's content when it was processed;
    -- a rerun compares it with the item the source yields now.
    fingerprint bytea,
    PRIMARY KEY (run_id, step_id, item_key)
);

-- Effect plans of chunks whose effects land in a separate store: recorded
-- before they apply, marked applied after.
CREATE TABLE chunk_plans (
    run_id    text COLLATE "C" NOT NULL,
    step_id   text COLLATE "C" NOT NULL,
    effect_id text COLLATE "C" NOT NULL,
    status    text NOT NULL,                    -- planned|applied|superseded
    plan      bytea NOT NULL,                   -- JSON: items' operations and the writes
    PRIMARY KEY (run_id, step_id, effect_id)
);

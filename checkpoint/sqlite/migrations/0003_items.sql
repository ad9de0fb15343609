-- Item checkpoints of batch (ForEach) steps: one row per item, written a
-- chunk at a time. Kept apart from steps so a run's few steps load in one
-- small query and a million items never do.
CREATE TABLE items (
    run_id   TEXT NOT NULL,
    step_id  TEXT NOT NULL,              -- the ForEach step's name
    item_key TEXT NOT NULL,              -- the item's business key
    status   TEXT NOT NULL,              -- completed|rejected|skipped|planned
    output   BLOB,                       -- JSON
    error    TEXT NOT NULL DEFAULT '',
    attempt  INTEGER NOT NULL,
    chunk    TEXT NOT NULL DEFAULT '',   -- separate store: the chunk plan's effect ID
    PRIMARY KEY (run_id, step_id, item_key)
) WITHOUT ROWID;

-- Effect plans of chunks whose effects land in a separate store: recorded
-- before they apply, marked applied after.
CREATE TABLE chunk_plans (
    run_id    TEXT NOT NULL,
    step_id   TEXT NOT NULL,
    effect_id TEXT NOT NULL,
    status    TEXT NOT NULL,             -- planned|applied
    plan      BLOB NOT NULL,             -- JSON: items' operations and the writes
    PRIMARY KEY (run_id, step_id, effect_id)
) WITHOUT ROWID;

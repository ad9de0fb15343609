-- Changes to a batch step's source found by a rerun, and the operator's
-- decisions on them. A rerun that finds a finished item changed (or gone,
-- or new beyond the declared total) records the changes it names in its
-- refusal here as 'refused'; an acceptance (resume --accept-changed)
-- accepts exactly those rows, matched by key, kind of change and the
-- fingerprint the refusal saw, and marks them 'accepted' with the
-- operator. A change found later, or changed again since it was shown, is
-- refused in its turn. item_key is '' for finished items that could not be
-- named (the source did not yield the same items again); items counts them.
CREATE TABLE item_changes (
    run_id      TEXT NOT NULL,
    step_id     TEXT NOT NULL,
    item_key    TEXT NOT NULL,
    change      TEXT NOT NULL,
    fingerprint BLOB,
    items       INTEGER NOT NULL DEFAULT 1,
    status      TEXT NOT NULL CHECK (status IN ('refused', 'accepted')),
    attempt     INTEGER NOT NULL,
    at          TEXT NOT NULL,
    operator    TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (run_id, step_id, item_key)
) WITHOUT ROWID;

-- A fingerprint of each batch item's content (its JSON, or what the job
-- declares), recorded with the item's checkpoint: a rerun compares it with
-- the item the source yields now, so a finished item whose data changed is
-- refused instead of being settled silently wrong. 16 bytes of SHA-256;
-- NULL for items recorded before this migration (not checked). Read it in
-- the sqlite3 shell with hex(fingerprint).
ALTER TABLE items ADD COLUMN fingerprint BLOB;

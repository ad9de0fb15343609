-- Idempotency-Keys are scoped per API caller (SQLite's
-- 0012_idempotency_scope.sql): scope is whose key it is (httpapi records
-- "token:NAME" for a token's requests, its bearer and its cookie session
-- alike), and a key is recorded, replayed and refused within its scope
-- only, so two callers that pick the same key make two independent
-- requests and neither sees the other's answer. The primary key becomes
-- (scope, key). The keys recorded before this migration get the empty
-- scope, which no caller has: they replay to nobody (whose they were is
-- not known), and a retry of one is answered by the run key its run ID is
-- made of, as a start without a key is. The default only fills those
-- rows: every insert names its scope.
ALTER TABLE idempotency_keys ADD COLUMN scope text COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE idempotency_keys ALTER COLUMN scope DROP DEFAULT;
ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_pkey, ADD PRIMARY KEY (scope, key);

-- A same-store chunk records its plan (every write's key, before and
-- after) in chunk_plans.plan: some 300 kB of JSON per 1000 transfers,
-- which the default pglz compresses in about 3 ms on the commit's path.
-- lz4 does it in under a third of that, to about the same size. Servers
-- without lz4 (before PostgreSQL 14, or built without it) keep pglz.
DO $$
BEGIN
    IF current_setting('server_version_num')::int >= 140000 AND EXISTS (
        SELECT 1 FROM pg_settings WHERE name = 'default_toast_compression' AND 'lz4' = ANY (enumvals))
    THEN
        EXECUTE 'ALTER TABLE chunk_plans ALTER COLUMN plan SET COMPRESSION lz4';
    END IF;
END
$$;

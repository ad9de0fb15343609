-- Pausing a schedule: while paused_at is set, no scheduler sharing the
-- store fires the schedule (the operator, time and reason are beside it,
-- and in the audit table). An unpause without catch-up records the fires
-- the pause held as skipped: every fire after skip_from up to skip_until
-- is settled without running.
ALTER TABLE schedules ADD COLUMN paused_at timestamptz;   -- NULL when not paused
ALTER TABLE schedules ADD COLUMN paused_by text NOT NULL DEFAULT '';
ALTER TABLE schedules ADD COLUMN paused_reason text NOT NULL DEFAULT '';
ALTER TABLE schedules ADD COLUMN skip_from timestamptz;
ALTER TABLE schedules ADD COLUMN skip_until timestamptz;

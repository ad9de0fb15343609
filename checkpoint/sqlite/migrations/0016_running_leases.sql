-- The live leases of running queued runs, for a worker's look for a gone
-- runner's work on its host (HeldLeases, every poll of every idle
-- worker). Without it that look walked runs_queue, which also holds every
-- queued run: a backlog made each poll read all of it. Only running rows
-- are in this index, so it stays as small as the work in flight.
CREATE INDEX runs_running_lease ON runs (lease_until) WHERE status = 'running' AND queue IS NOT NULL;

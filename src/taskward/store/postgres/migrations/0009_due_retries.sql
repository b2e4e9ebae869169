-- 0009_due_retries: why — the reaper asks for due retries every second in every worker
-- (run_due_retries: retry_wait rows with retry_at <= now, or holding a cancellation request).
-- Its one statement's OR could not use an index by range, so both dialects read every
-- retry_wait row and sorted them on each tick: with 100,000 rows waiting for a retry (a downstream
-- outage) 55 ms a tick on SQLite and 22 ms on PostgreSQL, growing with the backlog. The
-- statement is now two ranges on partial indexes (queries.sql): due rows by retry_at on
-- idx_schedule_runs_retry (0001), and the rare rows holding a cancellation request (a request
-- recorded while the task ran, then a retryable failure) on this index, which holds only those.
CREATE INDEX idx_schedule_runs_retry_cancel
  ON schedule_runs(retry_at)
  WHERE status = 'retry_wait' AND cancel_requested_at IS NOT NULL;

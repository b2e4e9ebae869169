-- 0011_scheduling: why — the scheduling vocabulary of DESIGN.md R15-R18 and R20 changes what a
-- claim reads, so its columns and its index are designed together here (PostgreSQL's 0011 says
-- the same and also rewrites its claim page function; SQLite's run_claim_page is queries.sql).
--
-- Columns (R15: each field of TaskApplication in a column of its own):
--   run_after    R16: the not-before time the application asked for (NULL: none); admission
--                sets queued_at to it, so a delayed row is a queued row due in the future.
--   priority     R17: an integer in [-100, 100], higher first; 0 keeps ADR-0071's order.
--   claim_rank   -priority, a generated column: the claim index and its keyset cursor read
--                (claim_rank, queued_at, id) ascending, a row comparison SQLite serves as one
--                index range (SEARCH ... (claim_rank,queued_at,id)>(?,?,?)); on an expression
--                index (-priority) it only scans.
--   max_attempts R18: the effective attempt ceiling stored at admission; rows admitted before
--                this migration take the queue setting (R6) in force now.
--   limit_key    R20: the optional limit key; the implicit kind:<action_kind> is not stored.
-- Tables (R20): task_limits (an operator's limit per key) and task_limit_claims (the claims of
-- keys with a rate, a sliding window pruned as claims are taken).
ALTER TABLE schedule_runs ADD COLUMN run_after REAL;
ALTER TABLE schedule_runs ADD COLUMN priority INTEGER NOT NULL DEFAULT 0
  CHECK (priority BETWEEN -100 AND 100);
ALTER TABLE schedule_runs ADD COLUMN claim_rank INTEGER GENERATED ALWAYS AS (-priority) VIRTUAL;
ALTER TABLE schedule_runs ADD COLUMN max_attempts INTEGER NOT NULL DEFAULT 3
  CHECK (max_attempts >= 1);
ALTER TABLE schedule_runs ADD COLUMN limit_key TEXT;

UPDATE schedule_runs
SET max_attempts = (SELECT CAST(value AS INTEGER) FROM queue_settings WHERE name = 'max_attempts')
WHERE max_attempts <> (SELECT CAST(value AS INTEGER) FROM queue_settings
                       WHERE name = 'max_attempts');

CREATE INDEX idx_schedule_runs_claim_rank
  ON schedule_runs(claim_rank, queued_at, id)
  WHERE status = 'queued';
DROP INDEX idx_schedule_runs_claim;

-- R19: a task's retries (chain_parent_id) listed on its page; only retries set the column, so
-- the partial index costs ordinary admissions nothing.
CREATE INDEX idx_schedule_runs_chain_parent
  ON schedule_runs(chain_parent_id)
  WHERE chain_parent_id IS NOT NULL;

CREATE TABLE task_limits (
  limit_key   TEXT PRIMARY KEY,
  max_running INTEGER CHECK (max_running >= 0),
  rate        INTEGER CHECK (rate >= 1),
  period_s    REAL CHECK (period_s > 0),
  resume_max_running INTEGER CHECK (resume_max_running >= 1),
  updated_at  REAL NOT NULL,
  updated_by  TEXT,
  CHECK ((rate IS NULL) = (period_s IS NULL)),
  CHECK (max_running IS NOT NULL OR rate IS NOT NULL)
);

CREATE TABLE task_limit_claims (
  limit_key  TEXT NOT NULL,
  claimed_at REAL NOT NULL,
  task_id    TEXT NOT NULL
);
CREATE INDEX idx_task_limit_claims_key ON task_limit_claims(limit_key, claimed_at);

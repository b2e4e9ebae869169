-- 0015_lean_row_writes: why — issue 27 (CPU per task). SQLite evaluates `x IN ('a', 'b', 'c')` of
-- three or more constants by filling a temporary b-tree with the list, and a CHECK constraint or
-- a partial index's WHERE is evaluated afresh for every row an INSERT writes: each task's two
-- events and its outbox row built three such b-trees, ~30,000 instructions each, 5-7 % of a
-- drain's instructions (measured: docs/benchmarks.md#figures-that-justified-design-choices).
-- Two constants or fewer, and comparisons joined by OR, are evaluated in place. So:
--
--   task_events.kind          CHECK (kind = 'transition' OR ... ) instead of IN (three)
--   dispatch_outbox.status    CHECK (status = 'pending' OR ...) instead of IN (five)
--   idx_dispatch_outbox_finished  WHERE status NOT IN ('pending', 'delivering'): the same rows
--                             as IN ('delivered', 'dead_letter', 'expired') under the CHECK
--                             above; the statements that read it say it the same way (SQLite
--                             uses a partial index only for a query that repeats its WHERE).
--
-- Same constraints, same rows: a CHECK cannot change in place, so both tables are rebuilt as
-- SQLite documents (create the new table, copy, drop the old one, rename; no foreign key or
-- trigger refers to either). On a large store this copies both tables once.
-- Whoever adds an event kind or an outbox status adds it to the OR list (and to the NOT IN of
-- the finished index when it is not a finished status).
--
-- idx_schedule_runs_concurrency (ADR-0071 D2's table contract: its name, columns and rows are
-- kept) is rebuilt with its WHERE spelled as comparisons: every admission evaluated it.
DROP INDEX idx_schedule_runs_concurrency;
CREATE INDEX idx_schedule_runs_concurrency
  ON schedule_runs(concurrency_key, status)
  WHERE status = 'queued' OR status = 'running' OR status = 'retry_wait';
CREATE TABLE task_events_new (
  id            TEXT PRIMARY KEY,
  task_id       TEXT NOT NULL,
  kind          TEXT NOT NULL
                CHECK (kind = 'transition' OR kind = 'cancel_requested' OR kind = 'stale_result'),
  transition_id TEXT,
  status        TEXT NOT NULL,
  payload       TEXT NOT NULL CHECK (json_valid(payload)),
  created_at    REAL NOT NULL
);
INSERT INTO task_events_new (id, task_id, kind, transition_id, status, payload, created_at)
  SELECT id, task_id, kind, transition_id, status, payload, created_at FROM task_events
  ORDER BY rowid;
DROP TABLE task_events;
ALTER TABLE task_events_new RENAME TO task_events;
CREATE INDEX idx_task_events_task ON task_events(task_id);

CREATE TABLE dispatch_outbox_new (
  id               TEXT PRIMARY KEY,
  kind             TEXT NOT NULL,
  dedup_key        TEXT NOT NULL UNIQUE,
  schedule_run_id  TEXT,
  transition_id    TEXT,
  body             TEXT NOT NULL CHECK (json_valid(body)),
  status           TEXT NOT NULL DEFAULT 'pending'
                   CHECK (status = 'pending' OR status = 'delivering' OR status = 'delivered'
                          OR status = 'dead_letter' OR status = 'expired'),
  attempts         INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
  max_attempts     INTEGER NOT NULL CHECK (max_attempts >= 1),
  next_attempt_at  REAL NOT NULL,
  -- The deliverer's own lease: set exactly while the row is delivering.
  lease_owner      TEXT,
  lease_expires_at REAL,
  -- Names of the delivery targets that acknowledged this row; a retry skips them.
  acked_targets    TEXT NOT NULL DEFAULT '[]' CHECK (json_valid(acked_targets)),
  last_error       TEXT,
  created_at       REAL NOT NULL,
  updated_at       REAL NOT NULL,
  delivered_at     REAL,
  expires_at       REAL,
  CONSTRAINT dispatch_outbox_lease
    CHECK ((status = 'delivering') = (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL)),
  CONSTRAINT dispatch_outbox_delivered_at
    CHECK (status <> 'delivered' OR delivered_at IS NOT NULL)
);
INSERT INTO dispatch_outbox_new (
  id, kind, dedup_key, schedule_run_id, transition_id, body, status, attempts, max_attempts,
  next_attempt_at, lease_owner, lease_expires_at, acked_targets, last_error, created_at,
  updated_at, delivered_at, expires_at
)
  SELECT id, kind, dedup_key, schedule_run_id, transition_id, body, status, attempts,
         max_attempts, next_attempt_at, lease_owner, lease_expires_at, acked_targets,
         last_error, created_at, updated_at, delivered_at, expires_at
  FROM dispatch_outbox ORDER BY rowid;
DROP TABLE dispatch_outbox;
ALTER TABLE dispatch_outbox_new RENAME TO dispatch_outbox;
CREATE INDEX idx_dispatch_outbox_due
  ON dispatch_outbox(next_attempt_at, id)
  WHERE status = 'pending';
CREATE INDEX idx_dispatch_outbox_lease
  ON dispatch_outbox(lease_expires_at)
  WHERE status = 'delivering';
CREATE INDEX idx_dispatch_outbox_expiry
  ON dispatch_outbox(expires_at)
  WHERE status = 'pending' AND expires_at IS NOT NULL;
CREATE INDEX idx_dispatch_outbox_finished
  ON dispatch_outbox(updated_at)
  WHERE status NOT IN ('pending', 'delivering');
CREATE INDEX idx_dispatch_outbox_created ON dispatch_outbox(created_at, id);
CREATE INDEX idx_dispatch_outbox_run ON dispatch_outbox(schedule_run_id);

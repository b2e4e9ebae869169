-- 0015_lean_row_writes: why — issue 27 (CPU per task). SQLite evaluates `x IN ('a', 'b', 'c')` of
-- three or more constants by filling a temporary b-tree with the list, and a CHECK constraint or
-- a partial index's WHERE is evaluated afresh for every row a statement writes: each admission
-- built two such b-trees (schedule_runs' status CHECK and idx_schedule_runs_concurrency), each
-- task's two events and its outbox row three more, ~30,000 instructions each: ~8 % of an
-- admission, ~11 % of a drain's instructions (measured:
-- docs/benchmarks.md#figures-that-justified-design-choices). Two constants or fewer, and
-- comparisons joined by OR, are evaluated in place. So:
--
--   schedule_runs.status      CHECK (status = 'queued' OR ...) instead of IN (nine)
--   task_events.kind          CHECK (kind = 'transition' OR ...) instead of IN (three)
--   dispatch_outbox.status    CHECK (status = 'pending' OR ...) instead of IN (five)
--   idx_schedule_runs_concurrency  (ADR-0071 D2's table contract: its name, columns and rows
--                             are kept) WHERE status = 'queued' OR ... instead of IN (three)
--   idx_dispatch_outbox_finished  WHERE status NOT IN ('pending', 'delivering'): the same rows
--                             as IN ('delivered', 'dead_letter', 'expired') under the CHECK
--                             above; the statements that read it say it the same way (SQLite
--                             uses a partial index only for a query that repeats its WHERE).
--
-- Same constraints, same rows, same rowids: a CHECK cannot change in place, so the three tables
-- are rebuilt as SQLite documents (create the new table, copy, drop the old one, rename, create
-- its indexes again). The migration runner turns foreign keys off for the migration's
-- transaction and runs `PRAGMA foreign_key_check` before its COMMIT (store/sqlite/db.py), as
-- that procedure requires: workers.leased_run_id and schedule_runs.chain_parent_id refer to
-- schedule_runs. No trigger or view refers to these tables. On a large store this copies the
-- three tables once.
-- Whoever adds a status, an event kind or an outbox status adds it to its OR list (and to the
-- NOT IN of the finished-outbox index when it is not a finished status).
CREATE TABLE schedule_runs_new (
  id                    TEXT PRIMARY KEY,
  schedule_id           TEXT,
  invocation_id         TEXT,
  trigger_context       TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(trigger_context)),
  action_kind           TEXT NOT NULL,
  action_args           TEXT NOT NULL CHECK (json_valid(action_args)),
  status                TEXT NOT NULL DEFAULT 'queued'
                        CHECK (status = 'queued' OR status = 'waiting_dependency'
                               OR status = 'running' OR status = 'retry_wait'
                               OR status = 'completed' OR status = 'failed'
                               OR status = 'timed_out' OR status = 'skipped'
                               OR status = 'cancelled'),
  exit_code             INTEGER,
  chain_parent_id       TEXT REFERENCES schedule_runs(id),
  chain_depth           INTEGER NOT NULL DEFAULT 0,
  fired_at              REAL NOT NULL,
  ended_at              REAL,
  error_detail          TEXT,
  created_at            REAL NOT NULL,
  updated_at            REAL,
  status_reason_code    TEXT,
  status_reason_summary TEXT,
  status_evidence_refs  TEXT
                        CHECK (status_evidence_refs IS NULL OR json_valid(status_evidence_refs)),
  queued_at             REAL,
  leased_by             TEXT,
  lease_expires_at      REAL,
  concurrency_key       TEXT,
  lease_attempts        INTEGER NOT NULL DEFAULT 0 CHECK (lease_attempts >= 0),
  required_capabilities TEXT
                        CHECK (required_capabilities IS NULL OR json_valid(required_capabilities)),
  execution_target      TEXT,
  library_ref           TEXT,
  library_content_hash  TEXT,
  -- ADR-0072 D2: admission identity. New admitted rows always set all three.
  idempotency_key       TEXT,
  application_hash      TEXT,
  admission_source      TEXT,
  -- ADR-0072 D3/D5 lifecycle patch columns.
  retry_at              REAL,
  deadline_at           REAL,
  cancel_requested_at   REAL,
  cancel_requested_by   TEXT,
  -- 0011 (R15-R18, R20), 0012 (R21), 0014 (tracing).
  run_after             REAL,
  priority              INTEGER NOT NULL DEFAULT 0 CHECK (priority BETWEEN -100 AND 100),
  claim_rank            INTEGER GENERATED ALWAYS AS (-priority) VIRTUAL,
  max_attempts          INTEGER NOT NULL DEFAULT 3 CHECK (max_attempts >= 1),
  limit_key             TEXT,
  has_dependents        INTEGER NOT NULL DEFAULT 0 CHECK (has_dependents IN (0, 1)),
  trace_context         TEXT,
  CHECK (idempotency_key IS NULL OR (application_hash IS NOT NULL AND admission_source IS NOT NULL))
);
INSERT INTO schedule_runs_new (
  rowid, id, schedule_id, invocation_id, trigger_context, action_kind, action_args, status,
  exit_code, chain_parent_id, chain_depth, fired_at, ended_at, error_detail, created_at,
  updated_at, status_reason_code, status_reason_summary, status_evidence_refs, queued_at,
  leased_by, lease_expires_at, concurrency_key, lease_attempts, required_capabilities,
  execution_target, library_ref, library_content_hash, idempotency_key, application_hash,
  admission_source, retry_at, deadline_at, cancel_requested_at, cancel_requested_by, run_after,
  priority, max_attempts, limit_key, has_dependents, trace_context
)
  SELECT rowid, id, schedule_id, invocation_id, trigger_context, action_kind, action_args,
         status, exit_code, chain_parent_id, chain_depth, fired_at, ended_at, error_detail,
         created_at, updated_at, status_reason_code, status_reason_summary,
         status_evidence_refs, queued_at, leased_by, lease_expires_at, concurrency_key,
         lease_attempts, required_capabilities, execution_target, library_ref,
         library_content_hash, idempotency_key, application_hash, admission_source, retry_at,
         deadline_at, cancel_requested_at, cancel_requested_by, run_after, priority,
         max_attempts, limit_key, has_dependents, trace_context
  FROM schedule_runs;
DROP TABLE schedule_runs;
ALTER TABLE schedule_runs_new RENAME TO schedule_runs;
CREATE INDEX idx_schedule_runs_queue
  ON schedule_runs(status, queued_at)
  WHERE status IN ('queued', 'retry_wait');
CREATE INDEX idx_schedule_runs_concurrency
  ON schedule_runs(concurrency_key, status)
  WHERE status = 'queued' OR status = 'running' OR status = 'retry_wait';
CREATE UNIQUE INDEX idx_schedule_runs_idempotency
  ON schedule_runs(idempotency_key)
  WHERE idempotency_key IS NOT NULL;
CREATE UNIQUE INDEX idx_schedule_runs_running_concurrency
  ON schedule_runs(concurrency_key)
  WHERE status = 'running' AND concurrency_key IS NOT NULL;
CREATE INDEX idx_schedule_runs_lease
  ON schedule_runs(lease_expires_at)
  WHERE status = 'running';
CREATE INDEX idx_schedule_runs_retry
  ON schedule_runs(retry_at)
  WHERE status = 'retry_wait';
CREATE INDEX idx_schedule_runs_created ON schedule_runs(created_at, id);
CREATE INDEX idx_schedule_runs_status_created ON schedule_runs(status, created_at, id);
CREATE INDEX idx_schedule_runs_schedule ON schedule_runs(schedule_id, status)
  WHERE schedule_id IS NOT NULL;
CREATE INDEX idx_schedule_runs_retry_cancel
  ON schedule_runs(retry_at)
  WHERE status = 'retry_wait' AND cancel_requested_at IS NOT NULL;
CREATE INDEX idx_schedule_runs_claim_rank
  ON schedule_runs(claim_rank, queued_at, id)
  WHERE status = 'queued';
CREATE INDEX idx_schedule_runs_chain_parent
  ON schedule_runs(chain_parent_id)
  WHERE chain_parent_id IS NOT NULL;

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
INSERT INTO task_events_new (rowid, id, task_id, kind, transition_id, status, payload, created_at)
  SELECT rowid, id, task_id, kind, transition_id, status, payload, created_at FROM task_events;
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
  rowid, id, kind, dedup_key, schedule_run_id, transition_id, body, status, attempts, max_attempts,
  next_attempt_at, lease_owner, lease_expires_at, acked_targets, last_error, created_at,
  updated_at, delivered_at, expires_at
)
  SELECT rowid, id, kind, dedup_key, schedule_run_id, transition_id, body, status, attempts,
         max_attempts, next_attempt_at, lease_owner, lease_expires_at, acked_targets,
         last_error, created_at, updated_at, delivered_at, expires_at
  FROM dispatch_outbox;
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

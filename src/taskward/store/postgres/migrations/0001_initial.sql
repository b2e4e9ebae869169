-- 0001_initial: why — the run table of ADR-0071 D2 with ADR-0072's admission (D2) and
-- lifecycle (D3/D5) columns, the append-only transition facts (ADR-0071 D3 + transition
-- idempotency), task lifecycle events, the workers table (ADR-0071 D4) and queue settings
-- stored in the database so every worker shares the attempt ceiling (R6).

CREATE TABLE queue_settings (
  name        TEXT PRIMARY KEY,
  value       TEXT NOT NULL,
  updated_at  DOUBLE PRECISION NOT NULL
);
INSERT INTO queue_settings (name, value, updated_at) VALUES ('max_attempts', '3', 0);

-- schedule_id has no foreign key: schedules are disabled, never deleted (R11), so the record's
-- ON DELETE CASCADE could only ever destroy admitted work. invocation_id links to the
-- executing adapter's invocation record, which lives outside this store.
-- status defaults to 'queued': no producer writes 'running' directly (ADR-0072 D1).
CREATE TABLE schedule_runs (
  id                    TEXT PRIMARY KEY,
  schedule_id           TEXT,
  invocation_id         TEXT,
  trigger_context       JSONB NOT NULL DEFAULT '{}',
  action_kind           TEXT NOT NULL,
  action_args           JSONB NOT NULL,
  status                TEXT NOT NULL DEFAULT 'queued'
                        CHECK (status IN ('queued', 'waiting_dependency', 'running',
                                          'retry_wait', 'completed', 'failed',
                                          'timed_out', 'skipped', 'cancelled')),
  exit_code             INTEGER,
  chain_parent_id       TEXT REFERENCES schedule_runs(id),
  chain_depth           INTEGER NOT NULL DEFAULT 0,
  fired_at              DOUBLE PRECISION NOT NULL,
  ended_at              DOUBLE PRECISION,
  error_detail          TEXT,
  created_at            DOUBLE PRECISION NOT NULL,
  updated_at            DOUBLE PRECISION,
  status_reason_code    TEXT,
  status_reason_summary TEXT,
  status_evidence_refs  JSONB,
  queued_at             DOUBLE PRECISION,
  leased_by             TEXT,
  lease_expires_at      DOUBLE PRECISION,
  concurrency_key       TEXT,
  lease_attempts        INTEGER NOT NULL DEFAULT 0 CHECK (lease_attempts >= 0),
  required_capabilities JSONB,
  execution_target      TEXT,
  library_ref           TEXT,
  library_content_hash  TEXT,
  -- ADR-0072 D2: admission identity. New admitted rows always set all three.
  idempotency_key       TEXT,
  application_hash      TEXT,
  admission_source      TEXT,
  -- ADR-0072 D3/D5 lifecycle patch columns.
  retry_at              DOUBLE PRECISION,
  deadline_at           DOUBLE PRECISION,
  cancel_requested_at   DOUBLE PRECISION,
  cancel_requested_by   TEXT,
  CONSTRAINT schedule_runs_admission_identity
    CHECK (idempotency_key IS NULL OR (application_hash IS NOT NULL AND admission_source IS NOT NULL))
);

CREATE INDEX idx_schedule_runs_queue
  ON schedule_runs(status, queued_at)
  WHERE status IN ('queued', 'retry_wait');

CREATE INDEX idx_schedule_runs_concurrency
  ON schedule_runs(concurrency_key, status)
  WHERE status IN ('queued', 'running', 'retry_wait');

CREATE UNIQUE INDEX idx_schedule_runs_idempotency
  ON schedule_runs(idempotency_key)
  WHERE idempotency_key IS NOT NULL;

-- R7: two workers on two machines cannot both run the same serialization key.
CREATE UNIQUE INDEX idx_schedule_runs_running_concurrency
  ON schedule_runs(concurrency_key)
  WHERE status = 'running' AND concurrency_key IS NOT NULL;

-- The claim scan: (queued_at, id) keyset paging over queued rows (ADR-0071 D4).
CREATE INDEX idx_schedule_runs_claim
  ON schedule_runs(queued_at, id)
  WHERE status = 'queued';

CREATE INDEX idx_schedule_runs_lease
  ON schedule_runs(lease_expires_at)
  WHERE status = 'running';

CREATE INDEX idx_schedule_runs_retry
  ON schedule_runs(retry_at)
  WHERE status = 'retry_wait';

CREATE INDEX idx_schedule_runs_created ON schedule_runs(created_at, id);
CREATE INDEX idx_schedule_runs_status_created ON schedule_runs(status, created_at, id);

CREATE TABLE status_transitions (
  seq             BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
  id              TEXT PRIMARY KEY,
  entity_type     TEXT NOT NULL,
  entity_id       TEXT NOT NULL,
  previous_status TEXT,
  status          TEXT NOT NULL,
  reason_code     TEXT NOT NULL,
  reason_summary  TEXT,
  evidence_refs   JSONB,
  source          TEXT NOT NULL,
  actor           TEXT,
  created_at      DOUBLE PRECISION NOT NULL,
  metadata        JSONB,
  -- ADR-0072 D3: transition idempotency, unique per entity; request_hash detects reuse of a
  -- key with different content; event_id and lease_id complete the replayed result.
  idempotency_key TEXT,
  request_hash    TEXT,
  event_id        TEXT,
  lease_id        TEXT
);

CREATE UNIQUE INDEX idx_status_transitions_idempotency
  ON status_transitions(entity_id, idempotency_key)
  WHERE idempotency_key IS NOT NULL;

CREATE INDEX idx_status_transitions_entity ON status_transitions(entity_id, seq);

-- Facts are append-only: history is never rewritten (ADR-0072 D3).
CREATE FUNCTION taskward_refuse_fact_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'status_transitions is append-only';
END
$$;

CREATE TRIGGER status_transitions_append_only
  BEFORE UPDATE OR DELETE ON status_transitions
  FOR EACH ROW EXECUTE FUNCTION taskward_refuse_fact_change();

CREATE TRIGGER status_transitions_no_truncate
  BEFORE TRUNCATE ON status_transitions
  FOR EACH STATEMENT EXECUTE FUNCTION taskward_refuse_fact_change();

-- One lifecycle event per transition (kind 'transition'), plus cancellation requests and the
-- diagnostic results of stale owners whose terminal write lost its guard (never facts).
CREATE TABLE task_events (
  seq           BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
  id            TEXT PRIMARY KEY,
  task_id       TEXT NOT NULL,
  kind          TEXT NOT NULL CHECK (kind IN ('transition', 'cancel_requested', 'stale_result')),
  transition_id TEXT,
  status        TEXT NOT NULL,
  payload       JSONB NOT NULL,
  created_at    DOUBLE PRECISION NOT NULL
);

CREATE INDEX idx_task_events_task ON task_events(task_id, seq);
CREATE INDEX idx_task_events_created ON task_events(created_at);

CREATE TABLE workers (
  worker_id               TEXT PRIMARY KEY,
  advertised_capabilities JSONB NOT NULL DEFAULT '[]',
  execution_targets       JSONB NOT NULL DEFAULT '[]',
  last_heartbeat_at       DOUBLE PRECISION NOT NULL,
  leased_run_id           TEXT REFERENCES schedule_runs(id),
  served_kinds            JSONB NOT NULL DEFAULT '[]',
  hostname                TEXT,
  pid                     INTEGER,
  concurrency             INTEGER,
  started_at              DOUBLE PRECISION
);

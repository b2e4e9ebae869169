-- Named queries of the SQLite dialect. Both dialects define the same names (a unit test checks).
-- Parameters are :name binds; JSON travels as text. Time always arrives as :now (R9).

-- name: setting_get
SELECT value FROM queue_settings WHERE name = :name;

-- name: setting_put
INSERT INTO queue_settings (name, value, updated_at) VALUES (:name, :value, :now)
ON CONFLICT (name) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at;

-- name: run_insert_if_new
-- Admission (ADR-0072 D2, R8): insert a queued row unless the key exists; writes no fact.
INSERT INTO schedule_runs (
  id, schedule_id, invocation_id, trigger_context,
  action_kind, action_args, status, chain_depth,
  fired_at, created_at, queued_at, concurrency_key,
  required_capabilities, execution_target,
  library_ref, library_content_hash,
  idempotency_key, application_hash, admission_source
) VALUES (
  :id, :schedule_id, NULL, :trigger_context,
  :action_kind, :action_args, 'queued', 0,
  :now, :now, :now, :concurrency_key,
  :required_capabilities, :execution_target,
  :library_ref, :library_content_hash,
  :idempotency_key, :application_hash, :admission_source
)
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id;

-- name: run_get_by_key
SELECT id, application_hash FROM schedule_runs WHERE idempotency_key = :idempotency_key;

-- name: run_get
SELECT * FROM schedule_runs WHERE id = :id;

-- name: run_status
SELECT status FROM schedule_runs WHERE id = :id;

-- name: run_list
-- Newest first with a (created_at, id) keyset cursor; every filter is optional.
SELECT * FROM schedule_runs
WHERE (:status IS NULL OR status = :status)
  AND (:action_kind IS NULL OR action_kind = :action_kind)
  AND (:execution_target IS NULL OR execution_target = :execution_target)
  AND (:cursor_created_at IS NULL OR (created_at, id) < (:cursor_created_at, :cursor_id))
ORDER BY created_at DESC, id DESC
LIMIT :limit;

-- name: run_count_by_status
SELECT status, count(*) AS n FROM schedule_runs GROUP BY status;

-- name: fact_get_by_key
SELECT * FROM status_transitions WHERE entity_id = :entity_id AND idempotency_key = :idempotency_key;

-- name: fact_insert
INSERT INTO status_transitions (
  id, entity_type, entity_id, previous_status, status, reason_code, reason_summary,
  evidence_refs, source, actor, created_at, metadata, idempotency_key, request_hash,
  event_id, lease_id
) VALUES (
  :id, :entity_type, :entity_id, :previous_status, :status, :reason_code, :reason_summary,
  :evidence_refs, :source, :actor, :now, :metadata, :idempotency_key, :request_hash,
  :event_id, :lease_id
);

-- name: fact_list
SELECT * FROM status_transitions WHERE entity_id = :entity_id ORDER BY rowid;

-- name: event_insert
INSERT INTO task_events (id, task_id, kind, transition_id, status, payload, created_at)
VALUES (:id, :task_id, :kind, :transition_id, :status, :payload, :now);

-- name: event_list
SELECT * FROM task_events WHERE task_id = :task_id ORDER BY rowid;

-- name: run_request_cancel
-- Record a cooperative cancellation request on a running row; status is unchanged (D5).
UPDATE schedule_runs
SET cancel_requested_at = COALESCE(cancel_requested_at, :now),
    cancel_requested_by = COALESCE(cancel_requested_by, :by),
    updated_at = :now
WHERE id = :id AND status = 'running';

-- name: event_get_cancel_request
SELECT id FROM task_events
WHERE task_id = :task_id AND kind = 'cancel_requested'
  AND json_extract(payload, '$.idempotency_key') = :key;

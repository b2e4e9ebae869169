-- Named queries of the PostgreSQL dialect. Both dialects define the same names (a unit test checks).
-- Parameters are :name binds; JSON travels as text cast to jsonb. Time always arrives as :now (R9).

-- name: setting_get
SELECT value FROM queue_settings WHERE name = :name;

-- name: setting_put
INSERT INTO queue_settings (name, value, updated_at) VALUES (:name, :value, :now)
ON CONFLICT (name) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at;

-- name: run_insert_if_new
-- Admission (ADR-0072 D2, R8): insert a queued row unless the key exists; writes no fact.
-- One statement, its own transaction: the insert, the server clock (R9) and the wake-up of idle
-- workers (NOTIFY, sent only when a row was inserted) in a single round trip.
WITH inserted AS (
INSERT INTO schedule_runs (
  id, schedule_id, invocation_id, trigger_context,
  action_kind, action_args, status, chain_depth,
  fired_at, created_at, queued_at, concurrency_key,
  required_capabilities, execution_target,
  library_ref, library_content_hash,
  idempotency_key, application_hash, admission_source
) VALUES (
  :id, :schedule_id, NULL, :trigger_context::jsonb,
  :action_kind, :action_args::jsonb, 'queued', 0,
  :now, :now, :now, :concurrency_key,
  :required_capabilities::jsonb, :execution_target,
  :library_ref, :library_content_hash,
  :idempotency_key, :application_hash, :admission_source
)
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id
)
SELECT id, pg_notify('taskward_queued', '') AS notified FROM inserted;

-- name: run_get_by_key
SELECT id, application_hash FROM schedule_runs WHERE idempotency_key = :idempotency_key;

-- name: run_get
SELECT * FROM schedule_runs WHERE id = :id;

-- name: run_status
SELECT status FROM schedule_runs WHERE id = :id;

-- name: run_list
-- Newest first with a (created_at, id) keyset cursor; every filter is optional.
SELECT * FROM schedule_runs
WHERE (:status::text IS NULL OR status = :status)
  AND (:action_kind::text IS NULL OR action_kind = :action_kind)
  AND (:execution_target::text IS NULL OR execution_target = :execution_target)
  AND (:cursor_created_at::double precision IS NULL OR (created_at, id) < (:cursor_created_at, :cursor_id))
ORDER BY created_at DESC, id DESC
LIMIT :limit;

-- name: run_count_by_status
SELECT status, count(*) AS n FROM schedule_runs GROUP BY status;

-- name: run_count_by_status_target
-- Queue depth for the dashboard and /metrics: rows by status and execution target.
SELECT status, execution_target, count(*) AS n FROM schedule_runs
GROUP BY status, execution_target;

-- name: run_count_by_source
-- Admissions ever made, by source: rows are never deleted (R11), so this only grows.
SELECT admission_source, count(*) AS n FROM schedule_runs GROUP BY admission_source;

-- name: fact_count_by_edge
-- Transitions ever applied, by edge and reason: facts are append-only, so this only grows.
SELECT previous_status, status, reason_code, count(*) AS n FROM status_transitions
GROUP BY previous_status, status, reason_code;

-- name: fact_get_by_key
SELECT * FROM status_transitions WHERE entity_id = :entity_id AND idempotency_key = :idempotency_key;

-- name: fact_insert
-- One fact per applied transition. A taken (entity_id, idempotency_key) inserts nothing and
-- returns no row: the caller rolls back and answers with the original result (R3).
INSERT INTO status_transitions (
  id, entity_type, entity_id, previous_status, status, reason_code, reason_summary,
  evidence_refs, source, actor, created_at, metadata, idempotency_key, request_hash,
  event_id, lease_id
) VALUES (
  :id, :entity_type, :entity_id, :previous_status, :status, :reason_code, :reason_summary,
  :evidence_refs::jsonb, :source, :actor, :now, :metadata::jsonb, :idempotency_key, :request_hash,
  :event_id, :lease_id
)
ON CONFLICT (entity_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id;

-- name: fact_list
SELECT * FROM status_transitions WHERE entity_id = :entity_id ORDER BY seq;

-- name: event_insert
INSERT INTO task_events (id, task_id, kind, transition_id, status, payload, created_at)
VALUES (:id, :task_id, :kind, :transition_id, :status, :payload::jsonb, :now);

-- name: event_list
SELECT * FROM task_events WHERE task_id = :task_id ORDER BY seq;

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
  AND payload->>'idempotency_key' = :key;

-- name: worker_heartbeat
-- Upsert this worker's heartbeat and advertisement (ADR-0071 D4).
INSERT INTO workers (worker_id, advertised_capabilities, execution_targets, last_heartbeat_at,
                     leased_run_id, served_kinds, hostname, pid, concurrency, started_at)
VALUES (:worker_id, :advertised_capabilities::jsonb, :execution_targets::jsonb, :now,
        :leased_run_id, :served_kinds::jsonb, :hostname, :pid, :concurrency, :now)
ON CONFLICT (worker_id) DO UPDATE SET
  advertised_capabilities = excluded.advertised_capabilities,
  execution_targets = excluded.execution_targets,
  last_heartbeat_at = excluded.last_heartbeat_at,
  leased_run_id = excluded.leased_run_id,
  served_kinds = excluded.served_kinds,
  hostname = excluded.hostname,
  pid = excluded.pid,
  concurrency = excluded.concurrency;

-- name: worker_get
SELECT * FROM workers WHERE worker_id = :worker_id;

-- name: worker_list
SELECT * FROM workers ORDER BY last_heartbeat_at DESC, worker_id LIMIT :limit;

-- name: worker_live_list
SELECT * FROM workers WHERE :now - last_heartbeat_at <= :heartbeat_ttl;

-- name: run_running_concurrency_keys
SELECT DISTINCT concurrency_key FROM schedule_runs
WHERE status = 'running' AND concurrency_key IS NOT NULL;

-- name: run_claim_page
-- One (queued_at, id) keyset page of claim candidates (ADR-0071 D4, R7): queued rows of any
-- origin whose kind this worker serves, below the attempt ceiling, with no pending cancellation.
SELECT id, queued_at, action_kind, execution_target, required_capabilities, concurrency_key,
       lease_attempts,
       CASE WHEN jsonb_typeof(action_args -> 'timeout_s') = 'number'
            THEN (action_args ->> 'timeout_s')::float8 END AS timeout_s
FROM schedule_runs
WHERE status = 'queued'
  AND lease_attempts < :max_attempts
  AND cancel_requested_at IS NULL
  AND action_kind IN (SELECT jsonb_array_elements_text(:kinds::jsonb))
  AND (:cursor_queued_at::float8 IS NULL
       OR (queued_at, id) > (:cursor_queued_at::float8, :cursor_id::text))
ORDER BY queued_at, id
LIMIT :page_size;

-- name: run_expired_leases
-- Running rows whose lease expired strictly before :now (R6).
SELECT id, leased_by, lease_expires_at, lease_attempts, cancel_requested_at FROM schedule_runs
WHERE status = 'running' AND lease_expires_at IS NOT NULL AND lease_expires_at < :now
ORDER BY lease_expires_at
LIMIT :limit;

-- name: run_due_retries
-- retry_wait rows due now (retry_at <= :now, R6) or holding a cancellation request.
SELECT id, retry_at, lease_attempts, cancel_requested_at FROM schedule_runs
WHERE status = 'retry_wait' AND (retry_at <= :now OR cancel_requested_at IS NOT NULL)
ORDER BY retry_at
LIMIT :limit;

-- name: run_deadline_overdue
-- Running rows past deadline + grace whose owner is still heartbeating (R5).
SELECT r.id, r.leased_by, r.lease_expires_at, r.lease_attempts, r.deadline_at
FROM schedule_runs r JOIN workers w ON w.worker_id = r.leased_by
WHERE r.status = 'running' AND r.deadline_at IS NOT NULL
  AND r.deadline_at + :grace_s <= :now
  AND :now - w.last_heartbeat_at <= :heartbeat_ttl
LIMIT :limit;

-- name: run_cancel_requested_among
SELECT id FROM schedule_runs
WHERE id IN (SELECT jsonb_array_elements_text(:ids::jsonb))
  AND status = 'running' AND cancel_requested_at IS NOT NULL;

-- name: run_queued_unserved
-- Queued rows for the placement read: kinds, targets and capabilities to match against workers.
SELECT id, action_kind, execution_target, required_capabilities, lease_attempts,
       cancel_requested_at, concurrency_key
FROM schedule_runs WHERE id = :id AND status = 'queued';

-- name: summary_get
SELECT * FROM task_summaries WHERE session_key = :session_key;

-- name: summary_write
-- Insert a complete summary, or complete a pending one; a complete row is left untouched and
-- no row is returned (the caller compares hashes: equal is a replay, different a conflict).
INSERT INTO task_summaries (session_key, task_id, attempt, state, summary, summary_hash, reason,
                            created_at, updated_at)
VALUES (:session_key, :task_id, :attempt, 'complete', :summary::jsonb, :summary_hash, NULL, :now, :now)
ON CONFLICT (session_key) DO UPDATE SET
  state = 'complete', summary = excluded.summary, summary_hash = excluded.summary_hash,
  reason = NULL, updated_at = excluded.updated_at
WHERE task_summaries.state = 'pending'
RETURNING session_key;

-- name: summary_mark_pending
-- Record or update a pending reason; never turns a complete summary back into pending (D4).
INSERT INTO task_summaries (session_key, task_id, attempt, state, reason, created_at, updated_at)
VALUES (:session_key, :task_id, :attempt, 'pending', :reason, :now, :now)
ON CONFLICT (session_key) DO UPDATE SET reason = excluded.reason, updated_at = excluded.updated_at
WHERE task_summaries.state = 'pending'
RETURNING session_key;

-- name: summary_list_for_task
SELECT * FROM task_summaries WHERE task_id = :task_id ORDER BY attempt;

-- name: claim_context
-- Everything a claim pass reads before paging, in one round trip: the pass's time (the
-- server clock unless :now is given, R9), this worker's last heartbeat (NULL when unknown)
-- and the attempt ceiling (R6).
SELECT COALESCE(:now::float8, extract(epoch FROM clock_timestamp())::float8) AS now,
       (SELECT last_heartbeat_at FROM workers WHERE worker_id = :worker_id) AS last_heartbeat_at,
       (SELECT value FROM queue_settings WHERE name = 'max_attempts') AS max_attempts;

-- name: run_lock_candidates
-- Inside the claim transaction: the candidates still queued, locked; rows another claimer holds are skipped, not waited for.
SELECT id FROM schedule_runs
WHERE id IN (SELECT jsonb_array_elements_text(:ids::jsonb)) AND status = 'queued'
FOR UPDATE SKIP LOCKED;

-- dispatch_outbox (ADR-0072 D6, R12): notifications of committed facts and their delivery
-- state. Written by the enqueue in transitions.apply_transition and by taskward.outbox only;
-- none of these statements touches a task.

-- name: outbox_enqueue
-- One notification per dedup key, in the producer's transaction; a taken key inserts nothing.
-- NULL :max_attempts / :ttl_s take the defaults, which equal taskward.outbox's
-- DEFAULT_MAX_ATTEMPTS (10) and DEFAULT_TTL_S (7 days) (a test checks).
INSERT INTO dispatch_outbox (
  id, kind, dedup_key, schedule_run_id, transition_id, body, status, attempts, max_attempts,
  next_attempt_at, created_at, updated_at, expires_at
) VALUES (
  :id, :kind, :dedup_key, :schedule_run_id, :transition_id, :body::jsonb, 'pending', 0,
  COALESCE(:max_attempts::integer, 10), :now, :now, :now,
  :now + COALESCE(:ttl_s::float8, 604800.0)
)
ON CONFLICT (dedup_key) DO NOTHING;

-- name: outbox_get
SELECT * FROM dispatch_outbox WHERE id = :id;

-- name: outbox_list
-- Newest first with a (created_at, id) keyset cursor; every filter is optional.
SELECT * FROM dispatch_outbox
WHERE (:status::text IS NULL OR status = :status)
  AND (:schedule_run_id::text IS NULL OR schedule_run_id = :schedule_run_id)
  AND (:cursor_created_at::float8 IS NULL
       OR (created_at, id) < (:cursor_created_at::float8, :cursor_id::text))
ORDER BY created_at DESC, id DESC
LIMIT :limit;

-- name: outbox_count_by_status
SELECT status, count(*) AS n FROM dispatch_outbox GROUP BY status;

-- name: outbox_pending_work
-- What a deliverer pass has to do, read without locking rows: expired deliverer leases,
-- pending rows past their expiry, due pending rows.
SELECT
  EXISTS (SELECT 1 FROM dispatch_outbox
          WHERE status = 'delivering' AND lease_expires_at < :now) AS has_stale_leases,
  EXISTS (SELECT 1 FROM dispatch_outbox
          WHERE status = 'pending' AND expires_at IS NOT NULL AND expires_at < :now) AS has_expired,
  EXISTS (SELECT 1 FROM dispatch_outbox
          WHERE status = 'pending' AND next_attempt_at <= :now) AS has_due;

-- name: outbox_release_expired_leases
-- delivering -> pending when the deliverer's lease expired (lease_expires_at < :now): its owner
-- stopped or stalled. The claim counted the attempt, so a row at its ceiling dead-letters and
-- one past its expiry expires instead.
UPDATE dispatch_outbox
SET status = CASE WHEN attempts >= max_attempts THEN 'dead_letter'
                  WHEN expires_at IS NOT NULL AND expires_at < :now THEN 'expired'
                  ELSE 'pending' END,
    last_error = 'delivery lease of ' || lease_owner || ' expired before an acknowledgement',
    lease_owner = NULL, lease_expires_at = NULL, next_attempt_at = :now, updated_at = :now
WHERE status = 'delivering' AND lease_expires_at < :now
RETURNING id, status;

-- name: outbox_expire_due
-- pending -> expired once past expires_at (expires_at < :now); the last error is kept.
UPDATE dispatch_outbox
SET status = 'expired', updated_at = :now,
    last_error = COALESCE(last_error, 'expired before delivery')
WHERE status = 'pending' AND expires_at IS NOT NULL AND expires_at < :now
RETURNING id;

-- name: outbox_claim_due
-- pending -> delivering for up to :limit due rows under this deliverer's lease; counts the
-- attempt. Rows another deliverer is claiming are skipped, not waited for.
WITH due AS (
  SELECT id FROM dispatch_outbox
  WHERE status = 'pending' AND next_attempt_at <= :now
    AND (expires_at IS NULL OR expires_at >= :now)
    AND attempts < max_attempts
  ORDER BY next_attempt_at, id
  LIMIT :limit
  FOR UPDATE SKIP LOCKED
)
UPDATE dispatch_outbox AS o
SET status = 'delivering', lease_owner = :owner, lease_expires_at = :now + :lease_s,
    attempts = o.attempts + 1, updated_at = :now
FROM due
WHERE o.id = due.id AND o.status = 'pending'
RETURNING o.*;

-- name: outbox_ack
-- delivering -> delivered, guarded by the lease (owner and attempt): a deliverer whose lease
-- was released and reclaimed writes nothing.
UPDATE dispatch_outbox
SET status = 'delivered', delivered_at = :now, updated_at = :now,
    lease_owner = NULL, lease_expires_at = NULL, acked_targets = :acked_targets::jsonb
WHERE id = :id AND status = 'delivering' AND lease_owner = :owner AND attempts = :attempts
RETURNING id;

-- name: outbox_fail
-- A failed attempt, guarded like outbox_ack: back to pending due at :now + :delay_s, or
-- dead_letter at the attempt ceiling, or expired past expires_at.
UPDATE dispatch_outbox
SET status = CASE WHEN attempts >= max_attempts THEN 'dead_letter'
                  WHEN expires_at IS NOT NULL AND expires_at < :now THEN 'expired'
                  ELSE 'pending' END,
    next_attempt_at = :now + :delay_s, last_error = :error,
    acked_targets = :acked_targets::jsonb,
    lease_owner = NULL, lease_expires_at = NULL, updated_at = :now
WHERE id = :id AND status = 'delivering' AND lease_owner = :owner AND attempts = :attempts
RETURNING status;

-- name: outbox_retry
-- Operator retry (R12): dead_letter or expired -> pending, attempts reset, due now, a fresh
-- expiry. Targets that already acknowledged the row are not sent it again.
UPDATE dispatch_outbox
SET status = 'pending', attempts = 0, next_attempt_at = :now, updated_at = :now,
    expires_at = :now + :ttl_s
WHERE id = :id AND status IN ('dead_letter', 'expired')
RETURNING *;

-- name: outbox_purge_finished
-- Delete finished rows (delivered, dead_letter, expired) last changed before :now -
-- :older_than_s. Pending and delivering rows are never purged (R11).
DELETE FROM dispatch_outbox
WHERE status IN ('delivered', 'dead_letter', 'expired') AND updated_at < :now - :older_than_s;

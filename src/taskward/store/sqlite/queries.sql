-- Named queries of the SQLite dialect. Both dialects define the same names (a unit test checks).
-- Parameters are :name binds; JSON travels as text. Time always arrives as :now (R9).

-- name: setting_get
SELECT value FROM queue_settings WHERE name = :name;

-- name: setting_put
INSERT INTO queue_settings (name, value, updated_at) VALUES (:name, :value, :now)
ON CONFLICT (name) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at;

-- name: run_insert_if_new
-- Admission (ADR-0072 D2, R8): insert a queued row unless the key exists, live or as an
-- archived task's tombstone (R23: run_get_by_key then answers from it); writes no fact.
-- :chain_parent_id / :chain_depth: NULL and 0, except for an operator retry (R19).
-- :trace_context: admission span's W3C context (JSON text, tracing.py), else NULL.
-- R16: queued_at is the later of the admission time and :run_after (a delayed row waits at the
-- end of the claim order until it is due); R18: the effective ceiling is stored on the row, the
-- application's or else the queue's setting (R6) read here, in the insert.
-- One statement, its own transaction; its row count (1 or 0) says whether it inserted, and the
-- caller made the id (RETURNING would cost SQLite a scratch table:
-- docs/benchmarks.md#figures-that-justified-design-choices).
INSERT INTO schedule_runs (
  id, schedule_id, invocation_id, trigger_context,
  action_kind, action_args, status, chain_parent_id, chain_depth,
  fired_at, created_at, queued_at, concurrency_key,
  required_capabilities, execution_target,
  library_ref, library_content_hash,
  idempotency_key, application_hash, admission_source,
  run_after, priority, max_attempts, limit_key, trace_context
)
SELECT
  :id, :schedule_id, NULL, :trigger_context,
  :action_kind, :action_args, 'queued', :chain_parent_id, :chain_depth,
  :now, :now, max(:now, COALESCE(:run_after, :now)), :concurrency_key,
  :required_capabilities, :execution_target,
  :library_ref, :library_content_hash,
  :idempotency_key, :application_hash, :admission_source,
  :run_after, :priority,
  COALESCE(:max_attempts,
           (SELECT CAST(value AS INTEGER) FROM queue_settings WHERE name = 'max_attempts'), 3),
  :limit_key, :trace_context
WHERE NOT EXISTS (SELECT 1 FROM task_key_tombstones WHERE idempotency_key = :idempotency_key)
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING;

-- name: run_get_by_key
-- The task holding a key, live or archived (R23: its tombstone): its application's hash (R8's
-- replay check) and its run_after (a binding's delay resolved against a replay,
-- fields.run_after_for_delay).
SELECT id, application_hash, run_after FROM schedule_runs
WHERE idempotency_key = :idempotency_key
UNION ALL
SELECT task_id, application_hash, run_after FROM task_key_tombstones
WHERE idempotency_key = :idempotency_key
LIMIT 1;

-- name: run_get
SELECT * FROM schedule_runs WHERE id = :id;

-- name: run_status
SELECT status FROM schedule_runs WHERE id = :id;

-- name: run_list
-- Newest first with a (created_at, id) keyset cursor; every filter is optional.
-- Every column but action_args (reads.list_tasks): the args come whole only when at most
-- :args_inline_bytes long (or :full_args), else as args_head, at most :args_head_chars of their
-- text without "env" (secrets never leave in a head), so a page's memory is bounded however
-- large the args. A column added to schedule_runs is added here too (test_http_reads_bounds).
SELECT id, schedule_id, invocation_id, trigger_context, action_kind, status, exit_code,
  chain_parent_id, chain_depth, fired_at, ended_at, error_detail, created_at, updated_at,
  status_reason_code, status_reason_summary, status_evidence_refs, queued_at, leased_by,
  lease_expires_at, concurrency_key, lease_attempts, required_capabilities, execution_target,
  library_ref, library_content_hash, idempotency_key, application_hash, admission_source,
  retry_at, deadline_at, cancel_requested_at, cancel_requested_by,
  run_after, priority, claim_rank, max_attempts, limit_key, has_dependents, trace_context,
  CASE WHEN :full_args OR length(CAST(action_args AS BLOB)) <= :args_inline_bytes
    THEN action_args END AS action_args,
  CASE WHEN NOT (:full_args OR length(CAST(action_args AS BLOB)) <= :args_inline_bytes)
    THEN substr(json_remove(action_args, '$.env'), 1, :args_head_chars) END AS args_head,
  length(CAST(action_args AS BLOB)) AS args_bytes
FROM schedule_runs
WHERE (:status IS NULL OR status = :status)
  AND (:action_kind IS NULL OR action_kind = :action_kind)
  AND (:execution_target IS NULL OR execution_target = :execution_target)
  AND (:cursor_created_at IS NULL OR (created_at, id) < (:cursor_created_at, :cursor_id))
ORDER BY created_at DESC, id DESC
LIMIT :limit;

-- name: run_list_retries
-- The operator retries of a task (R19): rows admitted by retry_task with chain_parent_id naming
-- it, oldest first, through idx_schedule_runs_chain_parent (migration 0011).
SELECT id, status, created_at, idempotency_key FROM schedule_runs
WHERE chain_parent_id = :task_id AND admission_source = 'retry'
ORDER BY created_at, id
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
  :evidence_refs, :source, :actor, :now, :metadata, :idempotency_key, :request_hash,
  :event_id, :lease_id
)
ON CONFLICT (entity_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id;

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

-- name: run_renew_lease
-- Renew a running row's lease (R25, ADR-0037 protocol version two): a compare-and-swap on the
-- lease id (owner and attempt, R4) that changes no status, so it is no transition and writes
-- no fact or event (claims.renewal). The expiry becomes now + :lease_ttl, never past the
-- deadline + :lease_slack_s and never earlier than it was (a renewal only extends). A renewal
-- after nominal expiry still applies while no reaper or claimant changed the row (R4).
-- Returns the new expiry; no row when the lease is not the row's (reaped, reclaimed, ended).
UPDATE schedule_runs
SET lease_expires_at = MAX(lease_expires_at,
                           MIN(:now + :lease_ttl,
                               COALESCE(deadline_at + :lease_slack_s, :now + :lease_ttl)))
WHERE id = :id AND status = 'running' AND leased_by = :leased_by
  AND lease_attempts = :lease_attempts
RETURNING lease_expires_at;

-- name: event_get_cancel_request
-- The recorded answer of a cooperative cancel request, returned exactly on replay (ADR-0072 D5).
SELECT id, payload FROM task_events
WHERE task_id = :task_id AND kind = 'cancel_requested'
  AND json_extract(payload, '$.idempotency_key') = :key;

-- name: worker_heartbeat
-- Upsert this worker's heartbeat and advertisement (ADR-0071 D4); a heartbeat says the
-- worker runs, so it clears a stop recorded under the same id.
INSERT INTO workers (worker_id, advertised_capabilities, execution_targets, last_heartbeat_at,
                     leased_run_id, served_kinds, hostname, pid, concurrency, started_at)
VALUES (:worker_id, :advertised_capabilities, :execution_targets, :now, :leased_run_id,
        :served_kinds, :hostname, :pid, :concurrency, :now)
ON CONFLICT (worker_id) DO UPDATE SET
  advertised_capabilities = excluded.advertised_capabilities,
  execution_targets = excluded.execution_targets,
  last_heartbeat_at = excluded.last_heartbeat_at,
  leased_run_id = excluded.leased_run_id,
  served_kinds = excluded.served_kinds,
  hostname = excluded.hostname,
  pid = excluded.pid,
  concurrency = excluded.concurrency,
  stopped_at = NULL;

-- name: worker_get
SELECT * FROM workers WHERE worker_id = :worker_id;

-- name: worker_list
SELECT * FROM workers ORDER BY last_heartbeat_at DESC, worker_id LIMIT :limit;

-- name: worker_stop
-- A clean stop (runtime.WorkerRuntime): the worker says it is gone, so it shows "stopped", not
-- "stale", and holds no lease any more (issue 28).
UPDATE workers SET stopped_at = :now, last_heartbeat_at = :now, leased_run_id = NULL
WHERE worker_id = :worker_id;

-- name: worker_leases
-- The running tasks each of :worker_ids (JSON list) holds the lease of, for a page of workers
-- in one statement (reads.list_workers); running rows are few (at most the workers' slots).
SELECT leased_by AS worker_id, id FROM schedule_runs
WHERE status = 'running' AND leased_by IN (SELECT value FROM json_each(:worker_ids))
ORDER BY leased_by, id;

-- name: worker_prunable
-- Workers prune_workers may delete (issue 28, R23): stopped, or stale since before :stale_before
-- without a stop (probably crashed); never one holding a live lease (a running task whose
-- lease has not expired). :worker_id NULL means every worker; :limit bounds a batch.
SELECT w.worker_id, w.last_heartbeat_at, w.stopped_at FROM workers w
WHERE (:worker_id IS NULL OR w.worker_id = :worker_id)
  AND (w.stopped_at IS NOT NULL OR w.last_heartbeat_at < :stale_before)
  AND NOT EXISTS (SELECT 1 FROM schedule_runs r
                  WHERE r.status = 'running' AND r.leased_by = w.worker_id
                    AND r.lease_expires_at >= :now)
ORDER BY w.last_heartbeat_at, w.worker_id
LIMIT :limit;

-- name: worker_delete_prunable
-- worker_prunable's rule again for each id chosen (a worker that came back meanwhile stays).
DELETE FROM workers
WHERE worker_id = :worker_id
  AND (stopped_at IS NOT NULL OR last_heartbeat_at < :stale_before)
  AND NOT EXISTS (SELECT 1 FROM schedule_runs r
                  WHERE r.status = 'running' AND r.leased_by = workers.worker_id
                    AND r.lease_expires_at >= :now);

-- name: worker_live_list
SELECT * FROM workers WHERE :now - last_heartbeat_at <= :heartbeat_ttl;

-- name: run_running_concurrency_keys
SELECT DISTINCT concurrency_key FROM schedule_runs
WHERE status = 'running' AND concurrency_key IS NOT NULL;

-- name: run_claim_page
-- One (claim_rank, queued_at, id) keyset page of claim candidates (ADR-0071 D4, R7, R16-R18,
-- R20): queued rows of any origin whose kind this worker serves (:kinds: the caller leaves out
-- kinds whose limit is paused or saturated), due now (R16: queued_at <= :now, so a delayed row
-- never fills a page), highest priority first (R17: claim_rank = -priority), below the row's own
-- attempt ceiling (R18), with no pending cancellation, and whose limit key is not held
-- (:held, a JSON array of saturated limit keys, R20).
-- INDEXED BY: SQLite gathers no statistics on its own and would otherwise scan and sort every
-- queued row on each pass; the partial claim index (0011) walks them in order, the cursor's row
-- comparison as one range.
-- locked = 1 always: a claim pass runs inside BEGIN IMMEDIATE, whose write lock already makes
-- every row of the page the pass's own (PostgreSQL locks the rows it hands out, migration 0006;
-- :targets, :capabilities, :soft and :lock are its parameters and unused here).
SELECT id, queued_at, claim_rank, action_kind, execution_target, required_capabilities,
       concurrency_key, limit_key, lease_attempts, max_attempts, 1 AS locked,
       CASE WHEN json_type(action_args, '$.timeout_s') IN ('integer', 'real')
            THEN json_extract(action_args, '$.timeout_s') END AS timeout_s
FROM schedule_runs INDEXED BY idx_schedule_runs_claim_rank
WHERE status = 'queued'
  AND queued_at <= :now
  AND lease_attempts < max_attempts
  AND cancel_requested_at IS NULL
  AND action_kind IN (SELECT value FROM json_each(:kinds))
  AND (limit_key IS NULL OR limit_key NOT IN (SELECT value FROM json_each(:held)))
  -- The cursor as one row comparison, always: without a cursor it compares against a start
  -- below every row (claim_rank >= -100), since an `IS NULL OR` around it would make SQLite
  -- scan the index from its beginning instead of seeking to the cursor.
  AND (claim_rank, queued_at, id)
      > (COALESCE(:cursor_rank, -1000), COALESCE(:cursor_queued_at, 0.0), COALESCE(:cursor_id, ''))
ORDER BY claim_rank, queued_at, id
LIMIT :page_size;

-- name: run_next_due
-- R16: how long until the earliest delayed queued row is due (seconds from :now, the store's
-- clock), so an idle worker wakes then instead of at its next poll. One range of
-- idx_schedule_runs_queue (status, queued_at); no row: nothing is waiting for its time.
-- (The index's own predicate is repeated, as SQLite uses a partial index only for a query that
-- states it.)
SELECT queued_at - :now AS due_in FROM schedule_runs INDEXED BY idx_schedule_runs_queue
WHERE status IN ('queued', 'retry_wait') AND status = 'queued' AND queued_at > :now
ORDER BY queued_at
LIMIT 1;

-- name: run_expired_leases
-- Running rows whose lease expired strictly before :now (R6), with their own ceiling (R18)
-- and their kind, whose backoff times the retry (R18).
SELECT id, action_kind, leased_by, lease_expires_at, lease_attempts, max_attempts,
  cancel_requested_at
FROM schedule_runs
WHERE status = 'running' AND lease_expires_at IS NOT NULL AND lease_expires_at < :now
ORDER BY lease_expires_at
LIMIT :limit;

-- name: maintenance_next_due
-- How long until the lease and retry reapers next have work (seconds from :now; NULL: nothing
-- in sight): the earliest lease expiry of a running row (idx_schedule_runs_lease) and the
-- earliest retry of a retry_wait row (idx_schedule_runs_retry), one index probe each. The
-- worker's maintenance loop wakes then when that comes before its interval (issue 27).
SELECT (SELECT min(lease_expires_at) FROM schedule_runs INDEXED BY idx_schedule_runs_lease
        WHERE status = 'running') - :now AS lease_due_in,
       (SELECT min(retry_at) FROM schedule_runs INDEXED BY idx_schedule_runs_retry
        WHERE status = 'retry_wait') - :now AS retry_due_in;

-- name: run_due_retries
-- retry_wait rows due now (retry_at <= :now, R6) or holding a cancellation request, at most
-- :limit, by retry_at. Two ranges on partial indexes (0009), each bounded by :limit, so a tick
-- costs what is due, not the whole retry_wait backlog; UNION drops a row found by both.
-- INDEXED BY: SQLite has no statistics to choose these partial indexes by (see 0009).
SELECT id, retry_at, lease_attempts, max_attempts, cancel_requested_at FROM (
  SELECT * FROM (
    SELECT id, retry_at, lease_attempts, max_attempts, cancel_requested_at FROM schedule_runs INDEXED BY idx_schedule_runs_retry
    WHERE status = 'retry_wait' AND retry_at <= :now
    ORDER BY retry_at LIMIT :limit
  ) AS due_now
  UNION
  SELECT * FROM (
    SELECT id, retry_at, lease_attempts, max_attempts, cancel_requested_at FROM schedule_runs INDEXED BY idx_schedule_runs_retry_cancel
    WHERE status = 'retry_wait' AND cancel_requested_at IS NOT NULL
    ORDER BY retry_at LIMIT :limit
  ) AS cancel_requested
) AS due
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
WHERE id IN (SELECT value FROM json_each(:ids))
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
VALUES (:session_key, :task_id, :attempt, 'complete', :summary, :summary_hash, NULL, :now, :now)
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

-- name: limit_state
-- R20: the limits in force (all, or those of :keys, a JSON array; NULL: all), each with the
-- rows of its key running now and, for a key with a rate, its claims in the window
-- (:now - period_s, :now]. A key kind:<k> counts running rows of kind <k>; any other key the
-- running rows that carry it (a task limit key never starts with kind:). With :held_only, only
-- the keys that admit no claim now (paused, at max_running, or at their rate): a claim pass
-- leaves their rows out of its pages (read with its first page, unlocked; the keys of the rows
-- it then claims are counted again under their locks, limit_lock).
WITH running AS (
  -- Running rows are few (at most the workers' slots): each key's count is read once.
  SELECT 'kind:' || action_kind AS limit_key, count(*) AS n FROM schedule_runs
  WHERE status = 'running' GROUP BY action_kind
  UNION ALL
  SELECT limit_key, count(*) FROM schedule_runs
  WHERE status = 'running' AND limit_key IS NOT NULL GROUP BY limit_key
), recent AS (
  SELECT c.limit_key, count(*) AS n FROM task_limit_claims c
  JOIN task_limits l ON l.limit_key = c.limit_key
  WHERE l.rate IS NOT NULL AND c.claimed_at > :now - l.period_s
  GROUP BY c.limit_key
), state AS (
  SELECT l.limit_key, l.max_running, l.rate, l.period_s, l.resume_max_running, l.updated_at,
         l.updated_by, COALESCE(r.n, 0) AS running, COALESCE(c.n, 0) AS recent
  FROM task_limits l
  LEFT JOIN running r ON r.limit_key = l.limit_key
  LEFT JOIN recent c ON c.limit_key = l.limit_key
)
SELECT * FROM state l
WHERE (:keys IS NULL OR l.limit_key IN (SELECT value FROM json_each(:keys)))
  AND (NOT :held_only
       OR (l.max_running IS NOT NULL AND l.running >= l.max_running)
       OR (l.rate IS NOT NULL AND l.recent >= l.rate))
ORDER BY l.limit_key;

-- name: limit_get
SELECT limit_key, max_running, rate, period_s, resume_max_running, updated_at, updated_by
FROM task_limits WHERE limit_key = :limit_key;

-- name: limit_put
-- An operator's limit on a key (R20): inserted, or replacing the key's limit whole.
INSERT INTO task_limits (limit_key, max_running, rate, period_s, updated_at, updated_by)
VALUES (:limit_key, :max_running, :rate, :period_s, :now, :updated_by)
ON CONFLICT (limit_key) DO UPDATE SET
  max_running = excluded.max_running, rate = excluded.rate, period_s = excluded.period_s,
  resume_max_running = NULL, updated_at = excluded.updated_at, updated_by = excluded.updated_by;

-- name: limit_pause
-- R20: pause a key (max_running 0), keeping its rate and remembering the max_running it had
-- (resume_max_running), in one statement: a pause of a paused key changes nothing it kept.
INSERT INTO task_limits (limit_key, max_running, rate, period_s, updated_at, updated_by)
VALUES (:limit_key, 0, NULL, NULL, :now, :updated_by)
ON CONFLICT (limit_key) DO UPDATE SET
  resume_max_running = CASE WHEN task_limits.max_running = 0
                            THEN task_limits.resume_max_running
                            ELSE task_limits.max_running END,
  max_running = 0, updated_at = excluded.updated_at, updated_by = excluded.updated_by;

-- name: limit_resume_delete
-- R20: lifting a pause that was all the key's limit removes the limit.
DELETE FROM task_limits
WHERE limit_key = :limit_key AND max_running = 0 AND resume_max_running IS NULL
  AND rate IS NULL;

-- name: limit_resume
-- R20: lifting a pause restores the max_running the key had before it (NULL: none, its rate
-- stays).
UPDATE task_limits SET max_running = resume_max_running, resume_max_running = NULL,
  updated_at = :now, updated_by = :updated_by
WHERE limit_key = :limit_key AND max_running = 0;

-- name: limit_delete
DELETE FROM task_limits WHERE limit_key = :limit_key;

-- name: limit_claims_delete
-- A cleared limit's window of claims (R20): nothing counts them any more.
DELETE FROM task_limit_claims WHERE limit_key = :limit_key;

-- name: limit_claims_prune
-- Claims of the keys in :keys (a JSON array) that left their key's window at :now; a claim pass
-- prunes the keys it records claims for, so the log holds at most one window per key.
DELETE FROM task_limit_claims
WHERE limit_key IN (SELECT value FROM json_each(:keys))
  AND claimed_at <= :now - COALESCE(
        (SELECT l.period_s FROM task_limits l WHERE l.limit_key = task_limit_claims.limit_key),
        0);

-- name: limit_lock
-- R20: the limits of :keys (a JSON array) this claim pass may count and take. SQLite's claim pass
-- holds the write lock already (BEGIN IMMEDIATE): every key is the pass's own.
SELECT limit_key FROM task_limits
WHERE limit_key IN (SELECT value FROM json_each(:keys))
ORDER BY limit_key;

-- name: limit_claim_insert_many
-- One claim of a key with a rate (R20), logged in the claim's transaction.
INSERT INTO task_limit_claims (limit_key, claimed_at, task_id)
VALUES (:limit_key, :now, :task_id);

-- name: claim_context
-- Everything a claim pass reads before paging, in one round trip: the pass's time, this
-- worker's last heartbeat (NULL when unknown) and whether any limit is set (R20).
SELECT :now AS now,
       (SELECT last_heartbeat_at FROM workers WHERE worker_id = :worker_id) AS last_heartbeat_at,
       EXISTS (SELECT 1 FROM task_limits) AS limited;

-- dispatch_outbox (ADR-0072 D6, R12): notifications of committed facts and their delivery
-- state. Written by the enqueue in transitions.rows.audit_rows' notification and by taskward.outbox only;
-- none of these statements touches a task.

-- name: outbox_enqueue
-- One notification per dedup key, in the producer's transaction; a taken key inserts nothing.
-- NULL :max_attempts / :ttl_s take the defaults, which equal taskward.outbox's
-- DEFAULT_MAX_ATTEMPTS (10) and DEFAULT_TTL_S (7 days) (a test checks).
INSERT INTO dispatch_outbox (
  id, kind, dedup_key, schedule_run_id, transition_id, body, status, attempts, max_attempts,
  next_attempt_at, created_at, updated_at, expires_at
) VALUES (
  :id, :kind, :dedup_key, :schedule_run_id, :transition_id, :body, 'pending', 0,
  COALESCE(:max_attempts, 10), :now, :now, :now, :now + COALESCE(:ttl_s, 604800.0)
)
ON CONFLICT (dedup_key) DO NOTHING;

-- name: outbox_get
SELECT * FROM dispatch_outbox WHERE id = :id;

-- name: outbox_list
-- Newest first with a (created_at, id) keyset cursor; every filter is optional.
SELECT * FROM dispatch_outbox
WHERE (:status IS NULL OR status = :status)
  AND (:schedule_run_id IS NULL OR schedule_run_id = :schedule_run_id)
  AND (:cursor_created_at IS NULL OR (created_at, id) < (:cursor_created_at, :cursor_id))
ORDER BY created_at DESC, id DESC
LIMIT :limit;

-- name: outbox_count_by_status
SELECT status, count(*) AS n FROM dispatch_outbox GROUP BY status;

-- name: outbox_pending_work
-- What a deliverer pass has to do, read without taking the write lock: expired deliverer
-- leases, pending rows past their expiry, due pending rows.
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
-- attempt. One statement under the write lock: two deliverers never hold the same row.
UPDATE dispatch_outbox
SET status = 'delivering', lease_owner = :owner, lease_expires_at = :now + :lease_s,
    attempts = attempts + 1, updated_at = :now
WHERE id IN (
  SELECT id FROM dispatch_outbox
  WHERE status = 'pending' AND next_attempt_at <= :now
    AND (expires_at IS NULL OR expires_at >= :now)
    AND attempts < max_attempts
  ORDER BY next_attempt_at, id
  LIMIT :limit
) AND status = 'pending'
RETURNING *;

-- name: outbox_ack
-- delivering -> delivered, guarded by the lease (owner and attempt): a deliverer whose lease
-- was released and reclaimed writes nothing.
UPDATE dispatch_outbox
SET status = 'delivered', delivered_at = :now, updated_at = :now,
    lease_owner = NULL, lease_expires_at = NULL, acked_targets = :acked_targets
WHERE id = :id AND status = 'delivering' AND lease_owner = :owner AND attempts = :attempts
RETURNING id;

-- name: outbox_fail
-- A failed attempt, guarded like outbox_ack: back to pending due at :now + :delay_s, or
-- dead_letter at the attempt ceiling, or expired past expires_at.
UPDATE dispatch_outbox
SET status = CASE WHEN attempts >= max_attempts THEN 'dead_letter'
                  WHEN expires_at IS NOT NULL AND expires_at < :now THEN 'expired'
                  ELSE 'pending' END,
    next_attempt_at = :now + :delay_s, last_error = :error, acked_targets = :acked_targets,
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
-- Delete at most :limit finished rows (delivered, dead_letter, expired) last changed before
-- :now - :older_than_s, oldest first (a batch: R23's progress and bounded transactions). Pending
-- and delivering rows are never purged (R11). "Finished" is spelled NOT IN ('pending',
-- 'delivering'), as idx_dispatch_outbox_finished's WHERE is (migration 0015), so it is used.
DELETE FROM dispatch_outbox
WHERE id IN (SELECT id FROM dispatch_outbox
             WHERE status NOT IN ('pending', 'delivering')
               AND updated_at < :now - :older_than_s
             ORDER BY updated_at LIMIT :limit);

-- name: schedule_insert
-- Create a schedule unless a live one has the name; a removed schedule's row stays (R11) and
-- frees its name.
INSERT INTO schedules (
  id, name, cron_expression, interval_s, anchor_at, timezone, enabled,
  action_kind, action_args, execution_target, required_capabilities,
  library_ref, library_content_hash,
  misfire_policy, catch_up_max, misfire_grace_s, overlap_policy,
  next_fire_at, created_at, updated_at, disabled_at
) VALUES (
  :id, :name, :cron_expression, :interval_s, :anchor_at, :timezone, :enabled,
  :action_kind, :action_args, :execution_target, :required_capabilities,
  :library_ref, :library_content_hash,
  :misfire_policy, :catch_up_max, :misfire_grace_s, :overlap_policy,
  :next_fire_at, :now, :now, CASE WHEN :enabled THEN NULL ELSE :now END
)
ON CONFLICT (name) WHERE removed_at IS NULL DO NOTHING
RETURNING *;

-- name: schedule_get
SELECT * FROM schedules WHERE id = :id;

-- name: schedule_get_by_name
SELECT * FROM schedules WHERE name = :name AND removed_at IS NULL;

-- name: schedule_list
-- Oldest first; removed schedules only when asked for.
SELECT * FROM schedules
WHERE (:include_removed OR removed_at IS NULL)
ORDER BY created_at, id
LIMIT :limit;

-- name: schedule_due
-- Schedules whose kind this scheduler's registry serves (:kinds) with a nominal fire due at
-- :now, or with decided fires still to admit (those whatever the schedule's state since).
SELECT * FROM schedules
WHERE ((enabled = 1 AND removed_at IS NULL AND next_fire_at <= :now) OR pending_fires <> '[]')
  AND action_kind IN (SELECT value FROM json_each(:kinds))
ORDER BY next_fire_at, id
LIMIT :limit;

-- name: schedule_has_active_run
-- The overlap check (R13): one run of this schedule in a non-terminal state (:statuses).
SELECT id FROM schedule_runs
WHERE schedule_id = :schedule_id AND status IN (SELECT value FROM json_each(:statuses))
LIMIT 1;

-- name: schedule_decide_if_revision
-- The scheduler's compare-and-swap: advance the cursor past the nominal times just decided,
-- count the skips (R13) and record the fires to admit. No row: another scheduler or an operator
-- changed the schedule since it was read, and this decision is void.
UPDATE schedules SET
  next_fire_at = :next_fire_at,
  pending_fires = :pending_fires,
  fire_count = fire_count + :fires,
  overlap_skips = overlap_skips + :overlap_skips,
  misfire_skips = misfire_skips + :misfire_skips,
  last_skip_reason = COALESCE(:last_skip_reason, last_skip_reason),
  last_skip_at = COALESCE(:last_skip_at, last_skip_at),
  last_error = NULL,
  last_error_at = NULL,
  revision = revision + 1,
  updated_at = :now
WHERE id = :id AND revision = :revision AND enabled = 1 AND removed_at IS NULL
RETURNING revision;

-- name: schedule_admitted_if_revision
-- The decided fires are admitted: clear them and record the latest run (and any refusal).
UPDATE schedules SET
  pending_fires = '[]',
  last_fire_at = COALESCE(:last_fire_at, last_fire_at),
  last_run_id = COALESCE(:last_run_id, last_run_id),
  last_error = COALESCE(:last_error, last_error),
  last_error_at = CASE WHEN :last_error IS NULL THEN last_error_at ELSE :now END,
  revision = revision + 1,
  updated_at = :now
WHERE id = :id AND revision = :revision
RETURNING revision;

-- name: schedule_record_error
-- Why a due fire could not be decided (say this registry rejects the template); written only
-- when the message changes, so a stuck schedule does not write every pass.
UPDATE schedules SET last_error = :error, last_error_at = :now, updated_at = :now
WHERE id = :id AND (last_error IS NULL OR last_error <> :error)
RETURNING id;

-- name: schedule_enable
-- Resume from :next_fire_at (the first nominal time after now): times passed while disabled
-- are not misfires.
UPDATE schedules SET enabled = 1, disabled_at = NULL, next_fire_at = :next_fire_at,
  revision = revision + 1, updated_at = :now
WHERE id = :id AND enabled = 0 AND removed_at IS NULL
RETURNING *;

-- name: schedule_disable
UPDATE schedules SET enabled = 0, disabled_at = COALESCE(disabled_at, :now),
  revision = revision + 1, updated_at = :now
WHERE id = :id AND enabled = 1
RETURNING *;

-- name: schedule_remove
-- R11: a removed schedule is disabled and marked removed, never deleted; its runs stay.
UPDATE schedules SET enabled = 0, disabled_at = COALESCE(disabled_at, :now), removed_at = :now,
  revision = revision + 1, updated_at = :now
WHERE id = :id AND removed_at IS NULL
RETURNING *;

-- name: schedule_totals
-- Metrics: schedules, enabled ones, and the recorded fire and skip counters summed.
SELECT count(*) AS schedules,
       coalesce(sum(CASE WHEN enabled = 1 THEN 1 ELSE 0 END), 0) AS enabled,
       coalesce(sum(fire_count), 0) AS fires,
       coalesce(sum(overlap_skips), 0) AS overlap_skips,
       coalesce(sum(misfire_skips), 0) AS misfire_skips
FROM schedules;

-- Invariant checks (taskward.checker, issue 8). Read-only and set-based: each statement scans
-- the store once and returns only the rows that break an invariant, so a 20,000-task store
-- checks in seconds. Lists of states, edges and reason codes arrive as JSON arrays built from
-- taskward.lifecycle, which stays the one owner of the graph. Facts are in insertion order
-- (rowid here, seq on PostgreSQL).

-- name: check_table_exists
-- Whether the table :name exists (the outbox may not be migrated yet).
SELECT count(*) > 0 AS present FROM sqlite_master WHERE type = 'table' AND name = :name;

-- name: check_duplicate_keys
-- Idempotency keys held by more than one task (the unique index should keep this empty), a
-- live run and an archived task's tombstone (R23) counting as two unless they are one task.
SELECT idempotency_key, count(DISTINCT id) AS n, min(id) AS task_id
FROM (SELECT idempotency_key, id FROM schedule_runs WHERE idempotency_key IS NOT NULL
      UNION ALL
      SELECT idempotency_key, task_id FROM task_key_tombstones) AS k
GROUP BY idempotency_key HAVING count(DISTINCT id) > 1;

-- name: check_runs_by_keys
-- The runs holding the idempotency keys of :keys (a JSON array), and the archived tasks whose
-- tombstones hold them (R23: the key's promise is kept).
SELECT idempotency_key, id FROM schedule_runs
WHERE idempotency_key IN (SELECT value FROM json_each(:keys))
UNION ALL
SELECT idempotency_key, task_id FROM task_key_tombstones
WHERE idempotency_key IN (SELECT value FROM json_each(:keys));

-- name: check_running_without_lease
-- Running rows without an owner or whose lease expired before :now (R6: lease_expires_at < now).
SELECT id, leased_by, lease_expires_at FROM schedule_runs
WHERE status = 'running'
  AND (leased_by IS NULL OR lease_expires_at IS NULL OR lease_expires_at < :now);

-- name: check_runs_against_facts
-- Each run against its facts: status equals the last fact's target (queued when there is none),
-- exactly one terminal fact on a terminal row and none on another, a terminal row untouched
-- since its terminal fact (updated_at), and lease_attempts equal to the number of claim facts.
WITH agg AS (
  SELECT entity_id, max(rowid) AS last_rowid,
         sum(CASE WHEN status = 'running' THEN 1 ELSE 0 END) AS claims,
         sum(CASE WHEN status IN (SELECT value FROM json_each(:terminal)) THEN 1 ELSE 0 END)
           AS terminals
  FROM status_transitions GROUP BY entity_id
), runs AS (
  SELECT r.id AS task_id, r.status, r.updated_at, r.lease_attempts,
         r.status IN (SELECT value FROM json_each(:terminal)) AS is_terminal,
         t.id AS last_id, t.status AS last_status, t.created_at AS last_at,
         COALESCE(a.claims, 0) AS claims, COALESCE(a.terminals, 0) AS terminals
  FROM schedule_runs r
  LEFT JOIN agg a ON a.entity_id = r.id
  LEFT JOIN status_transitions t ON t.rowid = a.last_rowid
), checked AS (
  SELECT runs.*,
         (last_id IS NULL AND status <> 'queued')
           OR (last_id IS NOT NULL AND last_status <> status) AS bad_status,
         (is_terminal AND terminals <> 1) OR (NOT is_terminal AND terminals > 0)
           AS bad_terminal_count,
         (is_terminal AND last_id IS NOT NULL AND last_status = status
           AND updated_at IS NOT last_at) AS bad_terminal_changed,
         lease_attempts <> claims AS bad_attempts
  FROM runs
)
SELECT * FROM checked
WHERE bad_status OR bad_terminal_count OR bad_terminal_changed OR bad_attempts;

-- name: check_fact_chain
-- Facts in insertion order per task: the first leaves 'queued', each leaves the previous one's
-- target, each follows a declared edge (:edges, JSON "from>to"), the n-th claim records lease
-- '<holder>/<n>', and a fact leaving 'running' was written under the lease of the claim just
-- before it: its recorded lease_id is that claim's, and the lease its writer presented (named
-- by its key: finish:/ack:<lease-id>, reap:/deadline:<task>:<attempt>) is that lease too.
WITH f AS (
  SELECT entity_id, id, previous_status, status, lease_id, idempotency_key,
         row_number() OVER w AS n,
         lag(status) OVER w AS prior_status,
         lag(lease_id) OVER w AS prior_lease_id,
         sum(CASE WHEN status = 'running' THEN 1 ELSE 0 END) OVER w AS attempt
  FROM status_transitions
  WINDOW w AS (PARTITION BY entity_id ORDER BY rowid)
), checked AS (
  SELECT f.*,
         (n = 1 AND previous_status IS NOT 'queued') AS bad_start,
         (n > 1 AND previous_status IS NOT prior_status) AS bad_chain,
         (COALESCE(previous_status, '') || '>' || status)
           NOT IN (SELECT value FROM json_each(:edges)) AS bad_edge,
         (status = 'running'
           AND (lease_id IS NULL OR lease_id NOT LIKE ('%/' || CAST(attempt AS TEXT))))
           AS bad_claim,
         (previous_status = 'running' AND prior_status = 'running' AND (
           lease_id IS NULL OR lease_id IS NOT prior_lease_id
           OR (idempotency_key LIKE 'finish:%' AND substr(idempotency_key, 8) IS NOT lease_id)
           OR (idempotency_key LIKE 'ack:%' AND substr(idempotency_key, 5) IS NOT lease_id)
           OR ((idempotency_key LIKE 'reap:%' OR idempotency_key LIKE 'deadline:%')
               AND substr(idempotency_key, instr(idempotency_key, ':') + 1)
                   IS NOT (entity_id || ':' || CAST(attempt AS TEXT))))) AS bad_lease
  FROM f
)
SELECT entity_id AS task_id, id AS transition_id, n, previous_status, status, prior_status,
       lease_id, prior_lease_id, idempotency_key, attempt,
       bad_start, bad_chain, bad_edge, bad_claim, bad_lease
FROM checked
WHERE bad_start OR bad_chain OR bad_edge OR bad_claim OR bad_lease;

-- name: check_fact_events
-- Facts without exactly one 'transition' event naming them (same task, target and event id),
-- then 'transition' events naming no fact.
SELECT f.entity_id AS task_id, f.id AS transition_id, NULL AS event_id, count(e.id) AS n,
       sum(CASE WHEN e.id IS NOT NULL AND (e.task_id IS NOT f.entity_id OR e.status IS NOT f.status
                     OR e.id IS NOT f.event_id) THEN 1 ELSE 0 END) AS mismatched
FROM status_transitions f
LEFT JOIN task_events e ON e.transition_id = f.id AND e.kind = 'transition'
GROUP BY f.entity_id, f.id
HAVING count(e.id) <> 1 OR mismatched > 0
UNION ALL
SELECT e.task_id, e.transition_id, e.id, 0, 0
FROM task_events e LEFT JOIN status_transitions f ON f.id = e.transition_id
WHERE e.kind = 'transition' AND f.id IS NULL;

-- name: check_fact_fields
-- Facts without an actor or without a reason code from :reason_codes (a JSON array).
SELECT entity_id AS task_id, id AS transition_id, actor, reason_code FROM status_transitions
WHERE actor IS NULL OR trim(actor) = '' OR reason_code IS NULL OR trim(reason_code) = ''
   OR reason_code NOT IN (SELECT value FROM json_each(:reason_codes));

-- name: check_facts_without_run
-- Facts of a task whose run row is gone (R11: nothing admission promised is deleted).
SELECT f.entity_id AS task_id, count(*) AS n FROM status_transitions f
LEFT JOIN schedule_runs r ON r.id = f.entity_id
WHERE r.id IS NULL
GROUP BY f.entity_id;

-- name: check_attempts
-- Runs above their own attempt ceiling (R18), and idle runs (:idle, JSON) stranded at it: no
-- claim ever selects them again and no path but a claim leads on (R6).
SELECT id AS task_id, status, lease_attempts, max_attempts FROM schedule_runs
WHERE lease_attempts > max_attempts
   OR (status IN (SELECT value FROM json_each(:idle)) AND lease_attempts >= max_attempts);

-- name: check_completed_summaries
-- Completed runs whose final attempt's summary ('<task-id>:<attempt>') is missing, not
-- complete, or was written or changed after the completed fact (ADR-0037 D4).
SELECT r.id AS task_id, r.lease_attempts AS attempt, f.id AS transition_id,
       f.created_at AS completed_at, f.evidence_refs, s.session_key, s.state,
       s.created_at AS summary_created_at, s.updated_at AS summary_updated_at
FROM schedule_runs r
JOIN status_transitions f ON f.entity_id = r.id AND f.status = 'completed'
LEFT JOIN task_summaries s ON s.session_key = r.id || ':' || r.lease_attempts
WHERE r.status = 'completed'
  AND (s.session_key IS NULL OR s.state <> 'complete'
       OR s.created_at > f.created_at OR s.updated_at > f.created_at);

-- name: check_outbox
-- Terminal facts (:terminal, JSON) without their 'task-terminal:<transition-id>' row, terminal
-- transitions with more than one row, and rows naming no terminal fact of their task.
SELECT f.entity_id AS task_id, f.id AS transition_id, NULL AS outbox_id, 0 AS n,
       'missing' AS problem
FROM status_transitions f
WHERE f.status IN (SELECT value FROM json_each(:terminal))
  AND NOT EXISTS (SELECT 1 FROM dispatch_outbox o WHERE o.dedup_key = 'task-terminal:' || f.id)
UNION ALL
SELECT min(o.schedule_run_id), o.transition_id, min(o.id), count(*), 'duplicate'
FROM dispatch_outbox o
WHERE o.kind = 'task_terminal' AND o.transition_id IS NOT NULL
GROUP BY o.transition_id HAVING count(*) > 1
UNION ALL
SELECT o.schedule_run_id, substr(o.dedup_key, 15), o.id, 1, 'orphan'
FROM dispatch_outbox o LEFT JOIN status_transitions f ON f.id = substr(o.dedup_key, 15)
WHERE o.dedup_key LIKE 'task-terminal:%'
  AND (f.id IS NULL OR f.status NOT IN (SELECT value FROM json_each(:terminal))
       OR o.schedule_run_id IS NOT f.entity_id OR o.transition_id IS NOT f.id);

-- name: check_fact_probe_update
-- Used only inside a transaction the checker rolls back: must be refused (append-only facts).
UPDATE status_transitions SET reason_summary = reason_summary WHERE id = :id;

-- name: check_fact_probe_delete
-- Used only inside a transaction the checker rolls back: must be refused (append-only facts).
DELETE FROM status_transitions WHERE id = :id;

-- name: check_fact_probe_insert
-- The probe fact the append-only check tries to change; always rolled back with its transaction.
INSERT INTO status_transitions (
  id, entity_type, entity_id, previous_status, status, reason_code, reason_summary,
  evidence_refs, source, actor, created_at, metadata
) VALUES (
  :id, 'schedule_run', :entity_id, 'queued', 'cancelled', 'operator',
  'invariant checker probe (always rolled back)', '[]', 'system', 'system:checker', :now, '{}'
);

-- Set-based writes (transitions.apply_transitions, the summary store, submit_tasks),
-- run by Tx.write_many: on SQLite with executemany, once per row, each row bound directly (no
-- JSON to build in Python nor to parse here: cheaper than a json_each insert, measured in
-- docs/benchmarks.md#figures-that-justified-design-choices).
-- So each is its one-row counterpart above, without RETURNING (executemany takes none):
-- write_many answers how many rows each statement wrote, and a caller that needs to know which
-- row was skipped reads it back.

-- name: fact_insert_many
-- fact_insert for each fact; a fact whose key is taken inserts nothing (the count falls short).
INSERT INTO status_transitions (
  id, entity_type, entity_id, previous_status, status, reason_code, reason_summary,
  evidence_refs, source, actor, created_at, metadata, idempotency_key, request_hash,
  event_id, lease_id
) VALUES (
  :id, :entity_type, :entity_id, :previous_status, :status, :reason_code, :reason_summary,
  :evidence_refs, :source, :actor, :now, :metadata, :idempotency_key, :request_hash,
  :event_id, :lease_id
)
ON CONFLICT (entity_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING;

-- name: event_insert_many
INSERT INTO task_events (id, task_id, kind, transition_id, status, payload, created_at)
VALUES (:id, :task_id, :kind, :transition_id, :status, :payload, :now);

-- name: outbox_enqueue_many
INSERT INTO dispatch_outbox (
  id, kind, dedup_key, schedule_run_id, transition_id, body, status, attempts, max_attempts,
  next_attempt_at, created_at, updated_at, expires_at
) VALUES (
  :id, :kind, :dedup_key, :schedule_run_id, :transition_id, :body, 'pending', 0,
  COALESCE(:max_attempts, 10), :now, :now, :now, :now + COALESCE(:ttl_s, 604800.0)
)
ON CONFLICT (dedup_key) DO NOTHING;

-- name: result_insert_many
-- R22: the return values of completions, written with their facts (transitions.apply: only
-- for moves whose compare-and-swap applied); one row per (task, attempt), a plain insert.
INSERT INTO task_results (task_id, attempt, result, result_bytes, created_at)
VALUES (:task_id, :attempt, :result, length(CAST(:result AS BLOB)), :now);

-- name: result_get
-- R22: a task's status and its completing attempt's stored result (NULL: none), in one read;
-- no row: no such task, live or archived. Only an applied completion writes a result, so the
-- attempt is the row's last lease's.
SELECT s.status, s.lease_attempts AS attempt, r.result
FROM schedule_runs s
LEFT JOIN task_results r ON r.task_id = s.id AND r.attempt = s.lease_attempts
WHERE s.id = :id
UNION ALL
-- R23: an archived task's, from its document
SELECT a.status, json_extract(a.document, '$.run.lease_attempts'),
       (SELECT json_extract(x.value, '$.result') FROM json_each(a.document, '$.results') x
        WHERE json_extract(x.value, '$.attempt') = json_extract(a.document, '$.run.lease_attempts'))
FROM archived_runs a WHERE a.id = :id
LIMIT 1;

-- name: result_of_dependencies
-- R22: each dependency of :task_id (R21) with its stored result (NULL: none, or not
-- completed), for the TaskContext of a function that declares one.
SELECT d.depends_on_id, r.result
FROM task_dependencies d
LEFT JOIN schedule_runs s ON s.id = d.depends_on_id AND s.status = 'completed'
LEFT JOIN task_results r ON r.task_id = s.id AND r.attempt = s.lease_attempts
WHERE d.task_id = :task_id
ORDER BY d.depends_on_id;

-- name: summary_insert_many
-- The complete summaries of a one-step finish as plain inserts: a session that already has a
-- row fails the statement and the batch takes the two-step path (PostgreSQL's comment says why).
INSERT INTO task_summaries (session_key, task_id, attempt, state, summary, summary_hash, reason,
                            created_at, updated_at)
VALUES (:session_key, :task_id, :attempt, 'complete', :summary, :summary_hash, NULL, :now, :now);

-- name: summary_write_many
-- summary_write for each session; a complete row is left untouched (the count falls short).
INSERT INTO task_summaries (session_key, task_id, attempt, state, summary, summary_hash, reason,
                            created_at, updated_at)
VALUES (:session_key, :task_id, :attempt, 'complete', :summary, :summary_hash, NULL, :now, :now)
ON CONFLICT (session_key) DO UPDATE SET
  state = 'complete', summary = excluded.summary, summary_hash = excluded.summary_hash,
  reason = NULL, updated_at = excluded.updated_at
WHERE task_summaries.state = 'pending';

-- name: fact_ids_among
-- Which of the facts :ids (a JSON array) exist: after write_many fell short of them.
SELECT id FROM status_transitions WHERE id IN (SELECT value FROM json_each(:ids));

-- name: run_insert_many_if_new
-- run_insert_if_new for each application of submit_tasks; a taken key inserts nothing (the
-- count falls short and admission.py reads the keys back).
INSERT INTO schedule_runs (
  id, schedule_id, invocation_id, trigger_context,
  action_kind, action_args, status, chain_parent_id, chain_depth,
  fired_at, created_at, queued_at, concurrency_key,
  required_capabilities, execution_target,
  library_ref, library_content_hash,
  idempotency_key, application_hash, admission_source,
  run_after, priority, max_attempts, limit_key, trace_context
)
SELECT
  :id, :schedule_id, NULL, :trigger_context,
  :action_kind, :action_args, 'queued', :chain_parent_id, :chain_depth,
  :now, :now, max(:now, COALESCE(:run_after, :now)), :concurrency_key,
  :required_capabilities, :execution_target,
  :library_ref, :library_content_hash,
  :idempotency_key, :application_hash, :admission_source,
  :run_after, :priority,
  COALESCE(:max_attempts,
           (SELECT CAST(value AS INTEGER) FROM queue_settings WHERE name = 'max_attempts'), 3),
  :limit_key, :trace_context
WHERE NOT EXISTS (SELECT 1 FROM task_key_tombstones WHERE idempotency_key = :idempotency_key)
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING;

-- name: session_revoke
-- A dashboard logout (dashboard/session.py, migration 0010): the session's id is refused from
-- now on, by every process; kept until the session would have expired anyway.
INSERT INTO revoked_sessions (session_id, expires_at) VALUES (:session_id, :expires_at)
ON CONFLICT (session_id) DO NOTHING;

-- name: session_revoked
-- Whether a dashboard session was logged out: one primary-key probe a request with a session.
SELECT 1 AS revoked FROM revoked_sessions WHERE session_id = :session_id;

-- name: session_revocations_purge
-- Revocations of sessions that have expired on their own (the cookie is refused anyway).
DELETE FROM revoked_sessions WHERE expires_at <= :now;

-- name: run_mark_dependencies
-- R21 admission (dependencies.link_admitted): mark the tasks :ids (a JSON array) as having
-- dependents and answer each one's status; an id not returned does not exist. On PostgreSQL
-- the same statement is the lock that orders the admission against the dependency's own end.
UPDATE schedule_runs SET has_dependents = 1
WHERE id IN (SELECT value FROM json_each(:ids))
RETURNING id, status;

-- name: task_dependency_insert_many
-- R21: one link per (dependent, dependency), in the dependent's admission transaction.
INSERT INTO task_dependencies (task_id, depends_on_id, created_at)
VALUES (:task_id, :depends_on_id, :now);

-- name: dependents_waiting
-- R21 (transitions.readiness): the waiting dependents of the tasks :ids that just ended, in id
-- order (PostgreSQL locks them in that order; SQLite's transactions are serial).
SELECT r.id, r.run_after FROM schedule_runs r
WHERE r.id IN (SELECT d.task_id FROM task_dependencies d
               WHERE d.depends_on_id IN (SELECT value FROM json_each(:ids)))
  AND r.status = 'waiting_dependency'
ORDER BY r.id;

-- name: waiting_among
-- R21: which of the tasks :ids are still waiting for their dependencies, in id order (locked
-- on PostgreSQL, as dependents_waiting).
SELECT id, run_after FROM schedule_runs
WHERE id IN (SELECT value FROM json_each(:ids)) AND status = 'waiting_dependency'
ORDER BY id;

-- name: dependency_verdicts
-- R21: per task of :ids, what the readiness rule needs of its dependencies, read after the
-- dependents' lock: how many, how many not completed, and the first (by id) that ended
-- otherwise than completed with its status. One row per task, whatever its fan-in.
SELECT v.task_id, v.total, v.open, v.failed_id, f.status AS failed_status
FROM (
  SELECT d.task_id, count(*) AS total,
         sum(CASE WHEN r.status = 'completed' THEN 0 ELSE 1 END) AS open,
         min(CASE WHEN r.status IN ('failed', 'timed_out', 'skipped', 'cancelled')
                  THEN r.id END) AS failed_id
  FROM task_dependencies d JOIN schedule_runs r ON r.id = d.depends_on_id
  WHERE d.task_id IN (SELECT value FROM json_each(:ids))
  GROUP BY d.task_id
) v
LEFT JOIN schedule_runs f ON f.id = v.failed_id;

-- name: dependencies_settleable
-- R21's maintenance pass: waiting tasks the rule moves now (no dependency still active, or one
-- ended otherwise than completed), oldest first, at most :limit. A safety net: the end of a
-- dependency settles its dependents in its own transaction.
SELECT w.id FROM schedule_runs w
WHERE w.status = 'waiting_dependency'
  AND (NOT EXISTS (SELECT 1 FROM task_dependencies d JOIN schedule_runs p ON p.id = d.depends_on_id
                   WHERE d.task_id = w.id
                     AND p.status IN ('queued', 'waiting_dependency', 'running', 'retry_wait'))
       OR EXISTS (SELECT 1 FROM task_dependencies d JOIN schedule_runs p ON p.id = d.depends_on_id
                  WHERE d.task_id = w.id
                    AND p.status IN ('failed', 'timed_out', 'skipped', 'cancelled')))
ORDER BY w.queued_at, w.id
LIMIT :limit;

-- name: task_parents
-- R21: the tasks :id depends on, with their states (task tree, GET /api/tasks/{id}/dependencies).
SELECT r.id, r.action_kind, r.status, r.idempotency_key, r.created_at, r.ended_at
FROM task_dependencies d JOIN schedule_runs r ON r.id = d.depends_on_id
WHERE d.task_id = :id
ORDER BY r.id
LIMIT :limit;

-- name: task_children
-- R21: the tasks that depend on :id, with their states.
SELECT r.id, r.action_kind, r.status, r.idempotency_key, r.created_at, r.ended_at
FROM task_dependencies d JOIN schedule_runs r ON r.id = d.task_id
WHERE d.depends_on_id = :id
ORDER BY r.id
LIMIT :limit;

-- name: run_waiting_on_running
-- R21: whether a task waits for a dependency that is running or will run again (retry_wait):
-- a burst worker keeps serving while one does, since that dependency's end may queue work for
-- it. A dependency still queued does not count (the worker claims it if it serves its kind,
-- and it must not wait for kinds it does not serve). Reads the running and retry_wait rows
-- (idx_schedule_runs_queue), then their links (idx_task_dependencies_on).
SELECT w.id FROM schedule_runs p
JOIN task_dependencies d ON d.depends_on_id = p.id
JOIN schedule_runs w ON w.id = d.task_id
WHERE p.status IN ('running', 'retry_wait') AND w.status = 'waiting_dependency'
LIMIT 1;

-- name: check_dependencies
-- R21 at quiescence: a waiting task with no dependency ('unlinked'), and a task claimed before
-- a dependency of its completed ('early': its first running fact precedes that dependency's
-- completed fact, or the dependency never completed). A waiting task the readiness rule would
-- move is dependencies_settleable's (the checker reads it too).
SELECT w.id AS task_id, 'unlinked' AS problem, NULL AS dependency_id FROM schedule_runs w
WHERE w.status = 'waiting_dependency'
  AND NOT EXISTS (SELECT 1 FROM task_dependencies d WHERE d.task_id = w.id)
UNION ALL
SELECT c.task_id, 'early', c.depends_on_id FROM (
  SELECT d.task_id, d.depends_on_id,
         (SELECT min(f.created_at) FROM status_transitions f
          WHERE f.entity_id = d.task_id AND f.status = 'running') AS claimed_at
  FROM task_dependencies d
) c
WHERE c.claimed_at IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM status_transitions f
                  WHERE f.entity_id = c.depends_on_id AND f.status = 'completed'
                    AND f.created_at <= c.claimed_at);

-- name: task_links_of
-- R21's links touching the tasks :ids (a JSON array), either end: one layer of a breadth-first
-- walk of a task's graph (dependencies.linked_tasks), by the primary key and
-- idx_task_dependencies_on.
SELECT task_id, depends_on_id FROM task_dependencies
WHERE task_id IN (SELECT value FROM json_each(:ids))
UNION
SELECT task_id, depends_on_id FROM task_dependencies
WHERE depends_on_id IN (SELECT value FROM json_each(:ids))
LIMIT :limit;

-- name: run_summaries
-- What a graph or tree shows of the tasks :ids (a JSON array).
SELECT id, action_kind, status, idempotency_key, created_at, ended_at FROM schedule_runs
WHERE id IN (SELECT value FROM json_each(:ids));

-- R23 retention: ``taskward prune`` (retention.py) and ``taskward archive`` (archive.py).

-- name: event_count_before
-- Events (task_events) created before :before: what ``taskward prune --dry-run`` would delete.
SELECT count(*) AS n FROM task_events WHERE created_at < :before;

-- name: event_prune_batch
-- R23: delete at most :limit events created before :before, oldest first (one batch of
-- ``taskward prune``; idx_task_events_created). Facts are never deleted here: the events are a
-- feed, the facts the record (a task's history reads its facts).
DELETE FROM task_events
WHERE id IN (SELECT id FROM task_events WHERE created_at < :before
             ORDER BY created_at LIMIT :limit);

-- name: outbox_count_finished
-- The finished rows outbox_purge_finished would delete: a dry run of it.
SELECT count(*) AS n FROM dispatch_outbox
WHERE status NOT IN ('pending', 'delivering') AND updated_at < :now - :older_than_s;

-- name: archive_counts
-- For ``taskward archive --dry-run``: terminal tasks last changed before :before (``old``), and
-- how many of them archive_candidates would take now (``ready``; the others are held by a live
-- task that refers to them -- a retry, a dependent -- or by a pending notification).
SELECT count(*) AS old,
       sum(CASE WHEN NOT EXISTS (SELECT 1 FROM schedule_runs c WHERE c.chain_parent_id = r.id)
                 AND NOT EXISTS (SELECT 1 FROM task_dependencies d WHERE d.depends_on_id = r.id)
                 AND NOT EXISTS (SELECT 1 FROM dispatch_outbox o
                                 WHERE o.schedule_run_id = r.id
                                   AND o.status IN ('pending', 'delivering'))
                THEN 1 ELSE 0 END) AS ready
FROM schedule_runs r
WHERE r.status IN (SELECT value FROM json_each(:terminal))
  AND r.created_at < :before AND COALESCE(r.updated_at, r.created_at) < :before;

-- name: archive_candidates
-- R23: at most :limit terminal tasks (:terminal, JSON) last changed before :before that nothing
-- live refers to: no run names one as its chain parent (a retry, R19: the foreign key), no
-- dependency link names one (R21: a dependent's links move with the dependent, so a dependency
-- goes after its dependents) and no notification of one is still pending or delivering. Oldest
-- first; what they hold back goes in a later batch, once the tasks that refer to it have.
SELECT r.id FROM schedule_runs r
WHERE r.status IN (SELECT value FROM json_each(:terminal))
  AND r.created_at < :before AND COALESCE(r.updated_at, r.created_at) < :before
  AND NOT EXISTS (SELECT 1 FROM schedule_runs c WHERE c.chain_parent_id = r.id)
  AND NOT EXISTS (SELECT 1 FROM task_dependencies d WHERE d.depends_on_id = r.id)
  AND NOT EXISTS (SELECT 1 FROM dispatch_outbox o
                  WHERE o.schedule_run_id = r.id AND o.status IN ('pending', 'delivering'))
ORDER BY r.created_at, r.id
LIMIT :limit;

-- name: archive_tombstones
-- R23: the keys of :ids (JSON) as tombstones, committed before their tasks move (archive.py
-- says why); a key already there stays as it is.
INSERT INTO task_key_tombstones (idempotency_key, application_hash, task_id, run_after,
                                 archived_at)
SELECT idempotency_key, application_hash, id, run_after, :now FROM schedule_runs
WHERE id IN (SELECT value FROM json_each(:ids)) AND idempotency_key IS NOT NULL
ON CONFLICT (idempotency_key) DO NOTHING;

-- name: archive_lock
-- The batch's tasks (:ids) that archive_candidates would still take, locked until the batch
-- commits (PostgreSQL; SQLite has one writer).
SELECT r.* FROM schedule_runs r
WHERE r.id IN (SELECT value FROM json_each(:ids)) AND r.status IN (SELECT value FROM json_each(:terminal))
  AND r.created_at < :before AND COALESCE(r.updated_at, r.created_at) < :before
  AND NOT EXISTS (SELECT 1 FROM schedule_runs c WHERE c.chain_parent_id = r.id)
  AND NOT EXISTS (SELECT 1 FROM task_dependencies d WHERE d.depends_on_id = r.id)
  AND NOT EXISTS (SELECT 1 FROM dispatch_outbox o
                  WHERE o.schedule_run_id = r.id AND o.status IN ('pending', 'delivering'))
ORDER BY r.created_at, r.id;

-- name: archive_facts_of
SELECT * FROM status_transitions WHERE entity_id IN (SELECT value FROM json_each(:ids)) ORDER BY rowid;

-- name: archive_events_of
SELECT * FROM task_events WHERE task_id IN (SELECT value FROM json_each(:ids)) ORDER BY rowid;

-- name: archive_summaries_of
SELECT * FROM task_summaries WHERE task_id IN (SELECT value FROM json_each(:ids)) ORDER BY task_id, attempt;

-- name: archive_results_of
SELECT * FROM task_results WHERE task_id IN (SELECT value FROM json_each(:ids)) ORDER BY task_id, attempt;

-- name: archive_links_of
SELECT * FROM task_dependencies WHERE task_id IN (SELECT value FROM json_each(:ids)) ORDER BY task_id, depends_on_id;

-- name: archive_notifications_of
SELECT * FROM dispatch_outbox WHERE schedule_run_id IN (SELECT value FROM json_each(:ids)) ORDER BY created_at, id;

-- name: archived_run_insert_many
-- One archived task's document (archive.py builds it), written before its rows leave.
INSERT INTO archived_runs (id, status, action_kind, created_at, ended_at, archived_at,
                           document)
VALUES (:id, :status, :action_kind, :created_at, :ended_at, :now, :document);

-- name: archive_delete_events
DELETE FROM task_events WHERE task_id IN (SELECT value FROM json_each(:ids));

-- name: archive_delete_summaries
DELETE FROM task_summaries WHERE task_id IN (SELECT value FROM json_each(:ids));

-- name: archive_delete_results
DELETE FROM task_results WHERE task_id IN (SELECT value FROM json_each(:ids));

-- name: archive_delete_links
DELETE FROM task_dependencies WHERE task_id IN (SELECT value FROM json_each(:ids));

-- name: archive_delete_notifications
DELETE FROM dispatch_outbox WHERE schedule_run_id IN (SELECT value FROM json_each(:ids));

-- name: archive_delete_facts
-- Allowed by the append-only trigger only because each task's document is in archived_runs.
DELETE FROM status_transitions WHERE entity_id IN (SELECT value FROM json_each(:ids));

-- name: archive_release_workers
-- A worker row still naming an archived task as its (informational) leased run forgets it.
UPDATE workers SET leased_run_id = NULL WHERE leased_run_id IN (SELECT value FROM json_each(:ids));

-- name: archive_delete_runs
DELETE FROM schedule_runs WHERE id IN (SELECT value FROM json_each(:ids));

-- name: archived_run_get
-- An archived task (R23): reads.get_task and list_transitions read it when the live row is gone.
SELECT id, archived_at, document FROM archived_runs WHERE id = :id;

-- name: dash_task_list
-- The dashboard's task list (activity.search_tasks): newest first from a (created_at, id)
-- keyset cursor; every filter optional. :q (lower case) matches a substring of the id, the
-- idempotency key, the kind, the args' text without "env" (secrets are never searched), the
-- error or the reason; a search scans rows newest first until the page is full. started_at is
-- the task's last claim (its last fact into running), for the duration column.
-- Its filter is spelled out again in dash_task_list_newer and dash_task_count (a statement a
-- direction keeps each on its index); tests/unit/test_queries.py holds the three equal.
SELECT r.id, r.status, r.action_kind, r.execution_target, r.priority, r.lease_attempts,
  r.max_attempts, r.created_at, r.ended_at, r.queued_at, r.run_after, r.status_reason_code,
  r.status_reason_summary, r.error_detail, r.idempotency_key, r.chain_parent_id,
  r.admission_source,
  substr(json_remove(r.action_args, '$.env'), 1, :args_head_chars) AS args_head,
  (SELECT max(f.created_at) FROM status_transitions f
   WHERE f.entity_id = r.id AND f.status = 'running') AS started_at
FROM schedule_runs r
WHERE (:status IS NULL OR r.status = :status)
  AND (:action_kind IS NULL OR r.action_kind = :action_kind)
  AND (:execution_target IS NULL OR r.execution_target = :execution_target)
  AND (:q IS NULL OR instr(lower(r.id), :q) > 0
       OR instr(lower(coalesce(r.idempotency_key, '')), :q) > 0
       OR instr(lower(r.action_kind), :q) > 0
       OR instr(lower(json_remove(r.action_args, '$.env')), :q) > 0
       OR instr(lower(coalesce(r.error_detail, '')), :q) > 0
       OR instr(lower(coalesce(r.status_reason_code, '')), :q) > 0
       OR instr(lower(coalesce(r.status_reason_summary, '')), :q) > 0)
  AND (:cursor_created_at IS NULL OR (r.created_at, r.id) < (:cursor_created_at, :cursor_id))
ORDER BY r.created_at DESC, r.id DESC
LIMIT :limit;

-- name: dash_task_list_newer
-- dash_task_list's previous page: the rows just newer than a (created_at, id), oldest first
-- (the caller reverses them).
SELECT r.id, r.status, r.action_kind, r.execution_target, r.priority, r.lease_attempts,
  r.max_attempts, r.created_at, r.ended_at, r.queued_at, r.run_after, r.status_reason_code,
  r.status_reason_summary, r.error_detail, r.idempotency_key, r.chain_parent_id,
  r.admission_source,
  substr(json_remove(r.action_args, '$.env'), 1, :args_head_chars) AS args_head,
  (SELECT max(f.created_at) FROM status_transitions f
   WHERE f.entity_id = r.id AND f.status = 'running') AS started_at
FROM schedule_runs r
WHERE (:status IS NULL OR r.status = :status)
  AND (:action_kind IS NULL OR r.action_kind = :action_kind)
  AND (:execution_target IS NULL OR r.execution_target = :execution_target)
  AND (:q IS NULL OR instr(lower(r.id), :q) > 0
       OR instr(lower(coalesce(r.idempotency_key, '')), :q) > 0
       OR instr(lower(r.action_kind), :q) > 0
       OR instr(lower(json_remove(r.action_args, '$.env')), :q) > 0
       OR instr(lower(coalesce(r.error_detail, '')), :q) > 0
       OR instr(lower(coalesce(r.status_reason_code, '')), :q) > 0
       OR instr(lower(coalesce(r.status_reason_summary, '')), :q) > 0)
  AND (r.created_at, r.id) > (:newer_created_at, :newer_id)
ORDER BY r.created_at ASC, r.id ASC
LIMIT :limit;

-- name: dash_task_count
-- How many tasks dash_task_list's filters match, counted up to :cap (a bounded scan).
SELECT count(*) AS n FROM (
  SELECT 1 FROM schedule_runs r
  WHERE (:status IS NULL OR r.status = :status)
    AND (:action_kind IS NULL OR r.action_kind = :action_kind)
    AND (:execution_target IS NULL OR r.execution_target = :execution_target)
    AND (:q IS NULL OR instr(lower(r.id), :q) > 0
         OR instr(lower(coalesce(r.idempotency_key, '')), :q) > 0
         OR instr(lower(r.action_kind), :q) > 0
         OR instr(lower(json_remove(r.action_args, '$.env')), :q) > 0
         OR instr(lower(coalesce(r.error_detail, '')), :q) > 0
         OR instr(lower(coalesce(r.status_reason_code, '')), :q) > 0
         OR instr(lower(coalesce(r.status_reason_summary, '')), :q) > 0)
  LIMIT :cap
) c;

-- name: dash_fact_endings
-- The overview's charts (activity.read_activity): the terminal facts in [:since, :until), by
-- time bucket (:bucket_s wide, from :since), kind, status and run-time class (the fact's time
-- less the task's last fact into running before it; NULL for a task that never ran). The
-- classes are activity.DURATION_BOUNDS, upper bounds in seconds; the last is "longer". Facts
-- have no time index (issue 7 keeps their inserts lean): this scans the facts, once per
-- overview page (the charts are not polled). The run times are
-- materialized first: their subquery is read once a fact, not once per CASE branch.
WITH e AS MATERIALIZED (
  SELECT CAST((f.created_at - :since) / :bucket_s AS INTEGER) AS bucket, r.action_kind,
    f.status,
    f.created_at - (SELECT max(s.created_at) FROM status_transitions s
                    WHERE s.entity_id = f.entity_id AND s.status = 'running'
                      AND s.created_at <= f.created_at) AS d
  FROM status_transitions f
  JOIN schedule_runs r ON r.id = f.entity_id
  WHERE f.created_at >= :since AND f.created_at < :until
    AND f.status IN ('completed', 'failed', 'timed_out', 'cancelled', 'skipped')
)
SELECT e.bucket, e.action_kind, e.status,
  CASE WHEN e.d IS NULL THEN NULL WHEN e.d <= 0.01 THEN 0 WHEN e.d <= 0.025 THEN 1
       WHEN e.d <= 0.05 THEN 2 WHEN e.d <= 0.1 THEN 3 WHEN e.d <= 0.25 THEN 4
       WHEN e.d <= 0.5 THEN 5 WHEN e.d <= 1 THEN 6 WHEN e.d <= 2.5 THEN 7
       WHEN e.d <= 5 THEN 8 WHEN e.d <= 10 THEN 9 WHEN e.d <= 30 THEN 10
       WHEN e.d <= 60 THEN 11 WHEN e.d <= 300 THEN 12 WHEN e.d <= 900 THEN 13
       WHEN e.d <= 3600 THEN 14 ELSE 15 END AS duration_class,
  count(*) AS n
FROM e
GROUP BY e.bucket, e.action_kind, e.status, duration_class;

-- name: dash_fact_flows
-- The overview's queue depth: the facts since :since by time bucket and edge (how many left
-- previous_status and entered status), read back from the counts of now (activity).
SELECT CAST((created_at - :since) / :bucket_s AS INTEGER) AS bucket, previous_status, status,
  count(*) AS n
FROM status_transitions
WHERE created_at >= :since
GROUP BY bucket, previous_status, status;

-- name: dash_admissions
-- Rows admitted (as queued) since :since, by time bucket: idx_schedule_runs_created.
SELECT CAST((created_at - :since) / :bucket_s AS INTEGER) AS bucket, count(*) AS n
FROM schedule_runs
WHERE created_at >= :since
GROUP BY bucket;

-- name: dash_count_by_kind_status
-- The overview's kinds in use: rows by kind and status (read when the page is drawn, not
-- polled).
SELECT action_kind, status, count(*) AS n FROM schedule_runs GROUP BY action_kind, status;

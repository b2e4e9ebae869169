-- 0006_claim_lock: why — a claim pass read its candidate page, then locked the candidates in a
-- second round trip (FOR UPDATE SKIP LOCKED), then found many of them taken: two lanes of one
-- worker, or two workers, read the same oldest rows and the later one rescanned (issue 7: a
-- batch made 9-13 round trips, 1-4 of them this). taskward_claim_lock_page reads the same
-- keyset page as taskward_claim_page (0005) and, in the same statement, locks the first p_lock
-- rows of it that this worker serves and no other transaction holds. Rows it did not lock come
-- back with locked = false: the page, its order and its keyset cursor are exactly 0005's, so a
-- pass still scans at most 5,000 rows (ADR-0071 D5) and never locks a row it cannot serve (a
-- host worker holding a sandbox row would hide it from the worker that can run it).
--
-- "Serves" is claims.WorkerSpec.serves in SQL: no target or one of p_targets, and every
-- required capability advertised (p_capabilities) except the soft (affinity) tokens p_soft,
-- which order and never filter. Python applies serves() again to what comes back.
--
-- The page is planned as in 0005 (index walk, no sort or bitmap scan of the whole queue); the
-- lock is a primary-key lookup per served row of the page (at most 50), and the page's own
-- order is restored by sorting those few rows. With sorts disabled that sort costs 1e10 on
-- paper, which turned on JIT compilation (600 ms a call): jit is off for this function.
-- 0005's taskward_claim_page stays: workers of the previous version call it until they are
-- restarted on this one (a rolling upgrade); nothing in this version does.
CREATE FUNCTION taskward_claim_lock_page(
  p_max_attempts     integer,
  p_kinds            jsonb,
  p_targets          jsonb,
  p_capabilities     jsonb,
  p_soft             jsonb,
  p_cursor_queued_at double precision,
  p_cursor_id        text,
  p_page_size        bigint,
  p_lock             bigint
) RETURNS TABLE (
  id                    text,
  queued_at             double precision,
  action_kind           text,
  execution_target      text,
  required_capabilities jsonb,
  concurrency_key       text,
  lease_attempts        integer,
  timeout_s             double precision,
  locked                boolean
)
LANGUAGE plpgsql VOLATILE
SET enable_sort = off
SET enable_incremental_sort = off
SET enable_bitmapscan = off
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
  IF p_cursor_queued_at IS NULL THEN
    RETURN QUERY
    WITH page AS MATERIALIZED (
      SELECT r.id, r.queued_at, r.action_kind, r.execution_target, r.required_capabilities,
             r.concurrency_key, r.lease_attempts,
             CASE WHEN jsonb_typeof(r.action_args -> 'timeout_s') = 'number'
                  THEN (r.action_args ->> 'timeout_s')::float8 END AS timeout_s
      FROM schedule_runs r
      WHERE
      r.status = 'queued'
      AND r.lease_attempts < p_max_attempts
      AND r.cancel_requested_at IS NULL
      AND r.action_kind = ANY (ARRAY(SELECT jsonb_array_elements_text(p_kinds)))
      ORDER BY r.queued_at, r.id
      LIMIT p_page_size
    ), mine AS MATERIALIZED (
      SELECT r.id FROM page p JOIN schedule_runs r ON r.id = p.id
      WHERE r.status = 'queued' AND r.cancel_requested_at IS NULL
        AND (COALESCE(p.execution_target, '') = '' OR p_targets ? p.execution_target)
        AND NOT EXISTS (
          SELECT 1 FROM jsonb_array_elements_text(COALESCE(p.required_capabilities, '[]'))
                   AS t(token)
          WHERE NOT p_capabilities ? t.token AND NOT p_soft ? t.token)
      ORDER BY p.queued_at, p.id
      LIMIT p_lock
      FOR UPDATE OF r SKIP LOCKED
    )
    SELECT p.*, m.id IS NOT NULL FROM page p LEFT JOIN mine m ON m.id = p.id
    ORDER BY p.queued_at, p.id;
  ELSE
    RETURN QUERY
    WITH page AS MATERIALIZED (
      SELECT r.id, r.queued_at, r.action_kind, r.execution_target, r.required_capabilities,
             r.concurrency_key, r.lease_attempts,
             CASE WHEN jsonb_typeof(r.action_args -> 'timeout_s') = 'number'
                  THEN (r.action_args ->> 'timeout_s')::float8 END AS timeout_s
      FROM schedule_runs r
      WHERE
      r.status = 'queued'
      AND r.lease_attempts < p_max_attempts
      AND r.cancel_requested_at IS NULL
      AND r.action_kind = ANY (ARRAY(SELECT jsonb_array_elements_text(p_kinds)))
      AND (r.queued_at, r.id) > (p_cursor_queued_at, p_cursor_id)
      ORDER BY r.queued_at, r.id
      LIMIT p_page_size
    ), mine AS MATERIALIZED (
      SELECT r.id FROM page p JOIN schedule_runs r ON r.id = p.id
      WHERE r.status = 'queued' AND r.cancel_requested_at IS NULL
        AND (COALESCE(p.execution_target, '') = '' OR p_targets ? p.execution_target)
        AND NOT EXISTS (
          SELECT 1 FROM jsonb_array_elements_text(COALESCE(p.required_capabilities, '[]'))
                   AS t(token)
          WHERE NOT p_capabilities ? t.token AND NOT p_soft ? t.token)
      ORDER BY p.queued_at, p.id
      LIMIT p_lock
      FOR UPDATE OF r SKIP LOCKED
    )
    SELECT p.*, m.id IS NOT NULL FROM page p LEFT JOIN mine m ON m.id = p.id
    ORDER BY p.queued_at, p.id;
  END IF;
END
$$;

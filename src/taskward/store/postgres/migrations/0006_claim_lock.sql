-- 0006_claim_lock: why — a claim pass read its candidate page, then locked the candidates in a
-- second round trip (FOR UPDATE SKIP LOCKED), then found many of them taken: two lanes of one
-- worker, or two workers, read the same oldest rows and the later one rescanned (issue 7: a
-- batch made 9-13 round trips, 1-4 of them this). taskward_claim_lock_page reads the page of
-- taskward_claim_page (0005, called as it is) and, in the same statement, locks the first
-- p_lock rows of it that this worker serves and no other transaction holds. Rows it did not lock
-- come back with locked = false: the page, its order and its keyset cursor are exactly 0005's,
-- so a pass still scans at most 5,000 rows (ADR-0071 D5) and never locks a row it cannot serve
-- (a host worker holding a sandbox row would hide it from the worker that can run it).
--
-- "Serves" is claims.WorkerSpec.serves in SQL: no target or one of p_targets, and every
-- required capability advertised (p_capabilities) except the soft (affinity) tokens p_soft,
-- which order and never filter. Python applies serves() again to what comes back.
--
-- The page keeps 0005's plan (an index walk, whatever the statistics). The lock is primary-key
-- lookups of the page's served ids, whatever the statistics: written as a join, the planner
-- (guessing that a function returns 1,000 rows and the queue holds one) walked every queued row
-- of a partial index and joined the page to each (120 ms a call at 5,000 queued rows); as
-- `id = ANY (ids)` with `status || ''`, which matches no index, only the key can serve. The
-- page's order is restored by sorting its few rows; with sorts disabled that sort costs 1e10 on
-- paper, which turned on JIT compilation (600 ms a call): jit is off for this function.
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
SET enable_bitmapscan = off
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
  RETURN QUERY
  WITH page AS MATERIALIZED (
    SELECT * FROM taskward_claim_page(
      p_max_attempts, p_kinds, p_cursor_queued_at, p_cursor_id, p_page_size
    ) WITH ORDINALITY AS p
  ), served AS MATERIALIZED (
    SELECT array_agg(p.id ORDER BY p.ordinality) AS ids FROM page p
    WHERE (COALESCE(p.execution_target, '') = '' OR p_targets ? p.execution_target)
      AND NOT EXISTS (
        SELECT 1 FROM jsonb_array_elements_text(COALESCE(p.required_capabilities, '[]'))
                 AS t(token)
        WHERE NOT p_capabilities ? t.token AND NOT p_soft ? t.token)
  ), mine AS MATERIALIZED (
    SELECT r.id FROM served s, schedule_runs r
    WHERE r.id = ANY (s.ids) AND r.status || '' = 'queued' AND r.cancel_requested_at IS NULL
    ORDER BY array_position(s.ids, r.id)
    LIMIT p_lock
    FOR UPDATE OF r SKIP LOCKED
  )
  SELECT p.id, p.queued_at, p.action_kind, p.execution_target, p.required_capabilities,
         p.concurrency_key, p.lease_attempts, p.timeout_s, m.id IS NOT NULL
  FROM page p LEFT JOIN mine m ON m.id = p.id
  ORDER BY p.ordinality;
END
$$;

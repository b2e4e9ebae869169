-- 0008_claim_lock_prefix: why — taskward_claim_lock_page (0006) looked up every served row of its
-- 50-row page by primary key and sorted them all before locking the first p_lock it could take:
-- ~0.4 ms of server time a claim pass whatever p_lock was, a third of a claim statement's cost
-- in a no-op drain (issue 7, measured with pg_stat_statements: 615 claim statements, 0.53 ms a
-- call in the lock page against 0.15 ms in the page itself). Most passes take the first p_lock
-- served rows: nobody else holds them. So the lock now tries that prefix first and looks past it
-- only when it came back short (another lane or worker holds some of those rows, or they were
-- claimed and committed since the page was read). The rows locked are the same: the first
-- p_lock served rows of the page that no other transaction holds, in page order (the prefix's
-- locked rows all come before the rest's); the page, its order and keyset cursor, the plans
-- (primary-key lookups, no sort worth a JIT) and every column returned are 0006's. A row that
-- requires no capability is served without expanding its empty list (a set-returning function
-- call per page row). The page is 0005's statement written here, under the same planner
-- settings, instead of a call of taskward_claim_page: that nested PL/pgSQL call, its three SET
-- clauses and its result set cost ~0.2 ms a pass, twice the statement itself. Its numbering
-- follows the index walk's order (the subquery's), so no sort is planned; taskward_claim_page
-- is dropped, as nothing else calls it.
CREATE OR REPLACE FUNCTION taskward_claim_lock_page(
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
  RETURN QUERY
  WITH page AS MATERIALIZED (
    -- 0005's two statements as one: the keyset bound only when a cursor is given (the branch
    -- not taken is a one-time filter, never run), each walking idx_schedule_runs_claim.
    SELECT q.*, row_number() OVER (ORDER BY q.queued_at, q.id) AS ordinality
    FROM (
      SELECT r.id, r.queued_at, r.action_kind, r.execution_target, r.required_capabilities,
             r.concurrency_key, r.lease_attempts,
             CASE WHEN jsonb_typeof(r.action_args -> 'timeout_s') = 'number'
                  THEN (r.action_args ->> 'timeout_s')::float8 END AS timeout_s
      FROM schedule_runs r
      WHERE p_cursor_queued_at IS NULL
        AND r.status = 'queued'
        AND r.lease_attempts < p_max_attempts
        AND r.cancel_requested_at IS NULL
        AND r.action_kind = ANY (ARRAY(SELECT jsonb_array_elements_text(p_kinds)))
      ORDER BY r.queued_at, r.id
      LIMIT p_page_size
    ) q
    UNION ALL
    SELECT q.*, row_number() OVER (ORDER BY q.queued_at, q.id) AS ordinality
    FROM (
      SELECT r.id, r.queued_at, r.action_kind, r.execution_target, r.required_capabilities,
             r.concurrency_key, r.lease_attempts,
             CASE WHEN jsonb_typeof(r.action_args -> 'timeout_s') = 'number'
                  THEN (r.action_args ->> 'timeout_s')::float8 END AS timeout_s
      FROM schedule_runs r
      WHERE p_cursor_queued_at IS NOT NULL
        AND r.status = 'queued'
        AND r.lease_attempts < p_max_attempts
        AND r.cancel_requested_at IS NULL
        AND r.action_kind = ANY (ARRAY(SELECT jsonb_array_elements_text(p_kinds)))
        AND (r.queued_at, r.id) > (p_cursor_queued_at, p_cursor_id)
      ORDER BY r.queued_at, r.id
      LIMIT p_page_size
    ) q
  ), served AS MATERIALIZED (
    SELECT array_agg(p.id ORDER BY p.ordinality) AS ids FROM page p
    WHERE (COALESCE(p.execution_target, '') = '' OR p_targets ? p.execution_target)
      AND (COALESCE(p.required_capabilities, '[]') = '[]'
           OR NOT EXISTS (
             SELECT 1 FROM jsonb_array_elements_text(p.required_capabilities) AS t(token)
             WHERE NOT p_capabilities ? t.token AND NOT p_soft ? t.token))
  ), head AS MATERIALIZED (
    SELECT s.ids[1:p_lock] AS ids, s.ids[p_lock + 1:] AS rest FROM served s
  ), mine_head AS MATERIALIZED (
    SELECT r.id FROM head h, schedule_runs r
    WHERE r.id = ANY (h.ids) AND r.status || '' = 'queued' AND r.cancel_requested_at IS NULL
    ORDER BY array_position(h.ids, r.id)
    FOR UPDATE OF r SKIP LOCKED
  ), mine_rest AS MATERIALIZED (
    SELECT r.id FROM head h, schedule_runs r
    WHERE (SELECT count(*) FROM mine_head) < p_lock
      AND r.id = ANY (h.rest) AND r.status || '' = 'queued' AND r.cancel_requested_at IS NULL
    ORDER BY array_position(h.rest, r.id)
    LIMIT p_lock - (SELECT count(*) FROM mine_head)
    FOR UPDATE OF r SKIP LOCKED
  ), mine AS (
    SELECT m.id FROM mine_head m UNION ALL SELECT m.id FROM mine_rest m
  )
  SELECT p.id, p.queued_at, p.action_kind, p.execution_target, p.required_capabilities,
         p.concurrency_key, p.lease_attempts, p.timeout_s, m.id IS NOT NULL
  FROM page p LEFT JOIN mine m ON m.id = p.id
  ORDER BY p.ordinality;
END
$$;

DROP FUNCTION taskward_claim_page(integer, jsonb, double precision, text, bigint);

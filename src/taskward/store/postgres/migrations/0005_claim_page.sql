-- 0005_claim_page: why — the claim page must cost the same at any queue depth (issue 7).
-- taskward never runs ANALYZE, and a server may run without autovacuum: without statistics
-- PostgreSQL guesses that a handful of rows are queued and plans run_claim_page as a bitmap scan
-- of EVERY queued row followed by a sort (2-5 s a page with 1,000,000 queued rows, where the
-- index walk takes 0.2 ms). This function plans the page with sorts and bitmap scans disabled
-- (SET clauses apply only while it runs), so the only plan left walks idx_schedule_runs_claim in
-- (queued_at, id) order and stops after p_page_size rows; a keyset page starts the walk at its
-- cursor. The rows and their order are exactly those of the former statement.
CREATE FUNCTION taskward_claim_page(
  p_max_attempts     integer,
  p_kinds            jsonb,
  p_cursor_queued_at double precision,
  p_cursor_id        text,
  p_page_size        bigint
) RETURNS TABLE (
  id                    text,
  queued_at             double precision,
  action_kind           text,
  execution_target      text,
  required_capabilities jsonb,
  concurrency_key       text,
  lease_attempts        integer,
  timeout_s             double precision
)
LANGUAGE plpgsql STABLE
SET enable_sort = off
SET enable_incremental_sort = off
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
BEGIN
  IF p_cursor_queued_at IS NULL THEN
    RETURN QUERY
    SELECT r.id, r.queued_at, r.action_kind, r.execution_target, r.required_capabilities,
           r.concurrency_key, r.lease_attempts,
           CASE WHEN jsonb_typeof(r.action_args -> 'timeout_s') = 'number'
                THEN (r.action_args ->> 'timeout_s')::float8 END
    FROM schedule_runs r
    WHERE r.status = 'queued'
      AND r.lease_attempts < p_max_attempts
      AND r.cancel_requested_at IS NULL
      AND r.action_kind = ANY (ARRAY(SELECT jsonb_array_elements_text(p_kinds)))
    ORDER BY r.queued_at, r.id
    LIMIT p_page_size;
  ELSE
    RETURN QUERY
    SELECT r.id, r.queued_at, r.action_kind, r.execution_target, r.required_capabilities,
           r.concurrency_key, r.lease_attempts,
           CASE WHEN jsonb_typeof(r.action_args -> 'timeout_s') = 'number'
                THEN (r.action_args ->> 'timeout_s')::float8 END
    FROM schedule_runs r
    WHERE r.status = 'queued'
      AND r.lease_attempts < p_max_attempts
      AND r.cancel_requested_at IS NULL
      AND r.action_kind = ANY (ARRAY(SELECT jsonb_array_elements_text(p_kinds)))
      AND (r.queued_at, r.id) > (p_cursor_queued_at, p_cursor_id)
    ORDER BY r.queued_at, r.id
    LIMIT p_page_size;
  END IF;
END
$$;

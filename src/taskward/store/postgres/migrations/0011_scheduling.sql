-- 0011_scheduling: why — the scheduling vocabulary of DESIGN.md R15-R18 and R20 changes what a
-- claim reads, so its columns, its index and the claim page are designed together here.
--
-- Columns (R15: each field of TaskApplication in a column of its own):
--   run_after    R16: the not-before time the application asked for (NULL: none). The claim
--                orders and filters by queued_at, which admission sets to run_after, so a
--                delayed row is a queued row whose queued_at lies in the future.
--   priority     R17: an integer in [-100, 100], higher first; 0 keeps ADR-0071's order.
--   claim_rank   -priority, a generated column: the claim index and its keyset cursor read
--                (claim_rank, queued_at, id) ascending, one row comparison that an index range
--                serves on both dialects (a mixed DESC/ASC keyset cannot be one range).
--   max_attempts R18: the effective attempt ceiling, stored at admission (the application's, else
--                its kind's, else the queue setting of R6 at that moment), so changing the
--                configuration later never strands a queued row at a ceiling it cannot leave.
--                Rows admitted before this migration take the queue setting in force now.
--   limit_key    R20: the optional limit key (tenant:acme); every row also has the implicit key
--                kind:<action_kind>, which is not stored.
-- Tables (R20): task_limits holds an operator's limit per key (max_running, 0 = paused; an
-- optional rate of `rate` claims per `period_s`); task_limit_claims logs the claims of keys
-- with a rate (a sliding window, pruned as claims are taken); a paused key remembers the
-- max_running it had (resume_max_running), which resuming restores.
ALTER TABLE schedule_runs ADD COLUMN run_after DOUBLE PRECISION;
ALTER TABLE schedule_runs ADD COLUMN priority INTEGER NOT NULL DEFAULT 0
  CONSTRAINT schedule_runs_priority_range CHECK (priority BETWEEN -100 AND 100);
ALTER TABLE schedule_runs ADD COLUMN claim_rank INTEGER GENERATED ALWAYS AS (-priority) STORED;
ALTER TABLE schedule_runs ADD COLUMN max_attempts INTEGER NOT NULL DEFAULT 3
  CONSTRAINT schedule_runs_max_attempts_range CHECK (max_attempts >= 1);
ALTER TABLE schedule_runs ADD COLUMN limit_key TEXT;

UPDATE schedule_runs SET max_attempts = s.value::integer
FROM queue_settings s
WHERE s.name = 'max_attempts' AND schedule_runs.max_attempts <> s.value::integer;

-- The claim order of R17: (priority DESC, queued_at, id) as (claim_rank, queued_at, id).
CREATE INDEX idx_schedule_runs_claim_rank
  ON schedule_runs(claim_rank, queued_at, id)
  WHERE status = 'queued';
DROP INDEX idx_schedule_runs_claim;

-- R19: a task's retries (chain_parent_id) listed on its page; only retries set the column, so
-- the partial index costs ordinary admissions nothing.
CREATE INDEX idx_schedule_runs_chain_parent
  ON schedule_runs(chain_parent_id)
  WHERE chain_parent_id IS NOT NULL;

CREATE TABLE task_limits (
  limit_key   TEXT PRIMARY KEY,
  max_running INTEGER CHECK (max_running >= 0),
  rate        INTEGER CHECK (rate >= 1),
  period_s    DOUBLE PRECISION CHECK (period_s > 0),
  resume_max_running INTEGER CHECK (resume_max_running >= 1),
  updated_at  DOUBLE PRECISION NOT NULL,
  updated_by  TEXT,
  CONSTRAINT task_limits_rate_period CHECK ((rate IS NULL) = (period_s IS NULL)),
  CONSTRAINT task_limits_something CHECK (max_running IS NOT NULL OR rate IS NOT NULL)
);

CREATE TABLE task_limit_claims (
  limit_key  TEXT NOT NULL,
  claimed_at DOUBLE PRECISION NOT NULL,
  task_id    TEXT NOT NULL
);
CREATE INDEX idx_task_limit_claims_key ON task_limit_claims(limit_key, claimed_at);

-- Counting a limited key's running rows needs no index of its own: running rows are few (at most
-- the workers' slots) and idx_schedule_runs_lease holds only them, so no claim or finish pays
-- for one more index entry.

-- The claim page of 0008 with R16-R18 and R20: due rows only (queued_at <= p_now), in
-- (claim_rank, queued_at, id) order on idx_schedule_runs_claim_rank, below each row's own
-- ceiling (max_attempts), and none whose limit key the caller found saturated (p_held: a JSON
-- array of limit keys; the caller leaves paused or saturated kinds out of p_kinds). Everything
-- else — the plan settings, the locking of the first p_lock served rows, the columns — is
-- 0008's; claim_rank, limit_key and max_attempts are returned too (the cursor, the limits
-- and the lease need them).
DROP FUNCTION taskward_claim_lock_page(
  integer, jsonb, jsonb, jsonb, jsonb, double precision, text, bigint, bigint);
CREATE FUNCTION taskward_claim_lock_page(
  p_now              double precision,
  p_kinds            jsonb,
  p_targets          jsonb,
  p_capabilities     jsonb,
  p_soft             jsonb,
  p_held             jsonb,
  p_cursor_rank      integer,
  p_cursor_queued_at double precision,
  p_cursor_id        text,
  p_page_size        bigint,
  p_lock             bigint
) RETURNS TABLE (
  id                    text,
  queued_at             double precision,
  claim_rank            integer,
  action_kind           text,
  execution_target      text,
  required_capabilities jsonb,
  concurrency_key       text,
  limit_key             text,
  lease_attempts        integer,
  max_attempts          integer,
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
    SELECT q.*, row_number() OVER (ORDER BY q.claim_rank, q.queued_at, q.id) AS ordinality
    FROM (
      SELECT r.id, r.queued_at, r.claim_rank, r.action_kind, r.execution_target,
             r.required_capabilities, r.concurrency_key, r.limit_key, r.lease_attempts,
             r.max_attempts,
             CASE WHEN jsonb_typeof(r.action_args -> 'timeout_s') = 'number'
                  THEN (r.action_args ->> 'timeout_s')::float8 END AS timeout_s
      FROM schedule_runs r
      WHERE p_cursor_queued_at IS NULL
        AND r.status = 'queued'
        AND r.queued_at <= p_now
        AND r.lease_attempts < r.max_attempts
        AND r.cancel_requested_at IS NULL
        AND r.action_kind = ANY (ARRAY(SELECT jsonb_array_elements_text(p_kinds)))
        AND (r.limit_key IS NULL OR NOT p_held ? r.limit_key)
      ORDER BY r.claim_rank, r.queued_at, r.id
      LIMIT p_page_size
    ) q
    UNION ALL
    SELECT q.*, row_number() OVER (ORDER BY q.claim_rank, q.queued_at, q.id) AS ordinality
    FROM (
      SELECT r.id, r.queued_at, r.claim_rank, r.action_kind, r.execution_target,
             r.required_capabilities, r.concurrency_key, r.limit_key, r.lease_attempts,
             r.max_attempts,
             CASE WHEN jsonb_typeof(r.action_args -> 'timeout_s') = 'number'
                  THEN (r.action_args ->> 'timeout_s')::float8 END AS timeout_s
      FROM schedule_runs r
      WHERE p_cursor_queued_at IS NOT NULL
        AND r.status = 'queued'
        AND r.queued_at <= p_now
        AND r.lease_attempts < r.max_attempts
        AND r.cancel_requested_at IS NULL
        AND r.action_kind = ANY (ARRAY(SELECT jsonb_array_elements_text(p_kinds)))
        AND (r.limit_key IS NULL OR NOT p_held ? r.limit_key)
        AND (r.claim_rank, r.queued_at, r.id) > (p_cursor_rank, p_cursor_queued_at, p_cursor_id)
      ORDER BY r.claim_rank, r.queued_at, r.id
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
  SELECT p.id, p.queued_at, p.claim_rank, p.action_kind, p.execution_target,
         p.required_capabilities, p.concurrency_key, p.limit_key, p.lease_attempts,
         p.max_attempts, p.timeout_s, m.id IS NOT NULL
  FROM page p LEFT JOIN mine m ON m.id = p.id
  ORDER BY p.ordinality;
END
$$;

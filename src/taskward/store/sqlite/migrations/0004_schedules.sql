-- 0004_schedules: why — ADR-0072 D1 admits scheduled fires through submit_task as queued rows
-- keyed schedule:<schedule-id>:<nominal-fire-epoch>; this table holds each schedule's cadence,
-- the TaskApplication template it admits, its misfire and overlap policies, and the cursor that
-- several schedulers advance with a compare-and-swap on ``revision``. Fire times are integer
-- UTC epoch seconds (DESIGN.md R13); overlap and misfire skips are counted here, never written
-- as task rows. A removed schedule is disabled and marked removed, never deleted (R11).
CREATE TABLE schedules (
  id                    TEXT PRIMARY KEY,
  name                  TEXT NOT NULL,
  cron_expression       TEXT,
  interval_s            INTEGER CHECK (interval_s IS NULL OR interval_s > 0),
  anchor_at             INTEGER,
  timezone              TEXT NOT NULL DEFAULT 'UTC',
  enabled               INTEGER NOT NULL DEFAULT 1 CHECK (enabled IN (0, 1)),
  -- The TaskApplication template (ADR-0072 D1), stored as admission canonicalised it.
  action_kind           TEXT NOT NULL,
  action_args           TEXT NOT NULL CHECK (json_valid(action_args)),
  execution_target      TEXT NOT NULL,
  required_capabilities TEXT NOT NULL DEFAULT '[]' CHECK (json_valid(required_capabilities)),
  library_ref           TEXT,
  library_content_hash  TEXT,
  misfire_policy        TEXT NOT NULL DEFAULT 'fire_once'
                        CHECK (misfire_policy IN ('skip', 'fire_once', 'catch_up')),
  catch_up_max          INTEGER NOT NULL DEFAULT 10 CHECK (catch_up_max BETWEEN 1 AND 1000),
  misfire_grace_s       INTEGER NOT NULL DEFAULT 60 CHECK (misfire_grace_s >= 0),
  overlap_policy        TEXT NOT NULL DEFAULT 'allow' CHECK (overlap_policy IN ('allow', 'skip')),
  -- The cursor: the next nominal fire not yet decided (NULL: the cadence never fires again).
  next_fire_at          INTEGER,
  last_fire_at          INTEGER,
  last_run_id           TEXT,
  -- Fires decided by the winning compare-and-swap but not yet confirmed admitted; any
  -- scheduler admits them (idempotently, by key) and clears the list.
  pending_fires         TEXT NOT NULL DEFAULT '[]' CHECK (json_valid(pending_fires)),
  fire_count            INTEGER NOT NULL DEFAULT 0,
  overlap_skips         INTEGER NOT NULL DEFAULT 0,
  misfire_skips         INTEGER NOT NULL DEFAULT 0,
  last_skip_reason      TEXT CHECK (last_skip_reason IS NULL OR last_skip_reason IN ('overlap', 'misfire')),
  last_skip_at          INTEGER,
  last_error            TEXT,
  last_error_at         REAL,
  revision              INTEGER NOT NULL DEFAULT 0,
  created_at            REAL NOT NULL,
  updated_at            REAL NOT NULL,
  disabled_at           REAL,
  removed_at            REAL,
  CHECK ((cron_expression IS NULL) <> (interval_s IS NULL)),
  CHECK (interval_s IS NULL OR anchor_at IS NOT NULL),
  CHECK (removed_at IS NULL OR enabled = 0)
);

-- A name identifies one live schedule; a removed schedule frees its name but keeps its row.
CREATE UNIQUE INDEX idx_schedules_name ON schedules(name) WHERE removed_at IS NULL;

CREATE INDEX idx_schedules_due ON schedules(next_fire_at) WHERE enabled = 1 AND removed_at IS NULL;

-- The overlap check: a schedule's runs that are not terminal.
CREATE INDEX idx_schedule_runs_schedule ON schedule_runs(schedule_id, status)
  WHERE schedule_id IS NOT NULL;

-- 0003_outbox: why — ADR-0072 D6 and DESIGN.md R12: a terminal transition enqueues a
-- notification in its own transaction, and deliverers move it pending -> delivering ->
-- delivered | dead_letter | expired under a compare-and-swap lease of their own (a failed
-- attempt returns to pending with a next-attempt time; an operator retry returns dead_letter or
-- expired to pending). Delivery state lives only here: nothing in this table changes a task.
-- schedule_run_id and transition_id carry no foreign keys: finished rows are purged on their own
-- schedule (R11), runs and facts never are, and a producer's insert must not lock the run's row.
CREATE TABLE dispatch_outbox (
  id               TEXT PRIMARY KEY,
  kind             TEXT NOT NULL,
  dedup_key        TEXT NOT NULL UNIQUE,
  schedule_run_id  TEXT,
  transition_id    TEXT,
  body             JSONB NOT NULL,
  status           TEXT NOT NULL DEFAULT 'pending'
                   CHECK (status IN ('pending', 'delivering', 'delivered', 'dead_letter',
                                     'expired')),
  attempts         INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
  max_attempts     INTEGER NOT NULL CHECK (max_attempts >= 1),
  next_attempt_at  DOUBLE PRECISION NOT NULL,
  -- The deliverer's own lease: set exactly while the row is delivering.
  lease_owner      TEXT,
  lease_expires_at DOUBLE PRECISION,
  -- Names of the delivery targets that acknowledged this row; a retry skips them.
  acked_targets    JSONB NOT NULL DEFAULT '[]',
  last_error       TEXT,
  created_at       DOUBLE PRECISION NOT NULL,
  updated_at       DOUBLE PRECISION NOT NULL,
  delivered_at     DOUBLE PRECISION,
  expires_at       DOUBLE PRECISION,
  CONSTRAINT dispatch_outbox_lease
    CHECK ((status = 'delivering') = (lease_owner IS NOT NULL AND lease_expires_at IS NOT NULL)),
  CONSTRAINT dispatch_outbox_delivered_at
    CHECK (status <> 'delivered' OR delivered_at IS NOT NULL)
);

-- The claim scan: due pending rows, oldest due first.
CREATE INDEX idx_dispatch_outbox_due
  ON dispatch_outbox(next_attempt_at, id)
  WHERE status = 'pending';

-- Expired deliverer leases return to pending.
CREATE INDEX idx_dispatch_outbox_lease
  ON dispatch_outbox(lease_expires_at)
  WHERE status = 'delivering';

CREATE INDEX idx_dispatch_outbox_expiry
  ON dispatch_outbox(expires_at)
  WHERE status = 'pending' AND expires_at IS NOT NULL;

-- Purge touches only finished rows (R11).
CREATE INDEX idx_dispatch_outbox_finished
  ON dispatch_outbox(updated_at)
  WHERE status IN ('delivered', 'dead_letter', 'expired');

CREATE INDEX idx_dispatch_outbox_created ON dispatch_outbox(created_at, id);
CREATE INDEX idx_dispatch_outbox_run ON dispatch_outbox(schedule_run_id);

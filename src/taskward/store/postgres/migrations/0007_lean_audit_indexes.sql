-- 0007_lean_audit_indexes: why — every task writes two facts and two events, and each of their
-- index entries is server CPU on the drain's critical path (issue 7: the server spent a quarter
-- of its time in index inserts). Four indexes were read by nothing another could not serve:
--   * the UNIQUE on status_transitions.seq and on task_events.seq: both are identity columns
--     (GENERATED ALWAYS), unique by construction; ordering by seq needs no index for a task's
--     few rows, and the checker's joins on seq are set-based over the whole table anyway;
--   * idx_status_transitions_entity (entity_id, seq): a task's facts are found through the
--     transition idempotency index, which leads with entity_id once it is not partial. Every
--     fact carries a key (TransitionRequest requires one), and a unique index treats NULLs as
--     distinct, so the full index enforces exactly what the partial one did (ADR-0072 D3: one
--     key per entity) and still serves ON CONFLICT (entity_id, idempotency_key) WHERE ...;
--   * idx_task_events_created: no statement reads events by time (a pruner of old events, which
--     R11 would allow, can bound itself by seq, which grows with time, or bring its own index).
-- The listing indexes (created_at) stay: the dashboard's pages read them. What this and the
-- batch statements' plain inserts bought is in docs/benchmarks.md (2026-12-01). On a large
-- store the unique index is rebuilt once here.
ALTER TABLE status_transitions DROP CONSTRAINT status_transitions_seq_key;
ALTER TABLE task_events DROP CONSTRAINT task_events_seq_key;
DROP INDEX idx_status_transitions_entity;
DROP INDEX idx_task_events_created;
DROP INDEX idx_status_transitions_idempotency;
CREATE UNIQUE INDEX idx_status_transitions_idempotency
  ON status_transitions(entity_id, idempotency_key);

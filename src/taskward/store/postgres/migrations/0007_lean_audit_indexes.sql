-- 0007_lean_audit_indexes: why — every task writes two facts and two events, and each of their
-- index entries is server CPU on the drain's critical path (issue 7: the server spent a quarter
-- of its time in index inserts). Three indexes held nothing another one does not:
--   * the UNIQUE on status_transitions.seq and on task_events.seq: both are identity columns
--     (GENERATED ALWAYS), unique by construction; ordering by seq needs no index for a task's
--     few rows, and the checker's joins on seq are set-based over the whole table anyway;
--   * idx_status_transitions_entity (entity_id, seq): a task's facts are found through the
--     transition idempotency index, which leads with entity_id once it is not partial. Every
--     fact carries a key (TransitionRequest requires one), and a unique index treats NULLs as
--     distinct, so the full index enforces exactly what the partial one did (ADR-0072 D3: one
--     key per entity) and still serves ON CONFLICT (entity_id, idempotency_key) WHERE ...
-- Measured (bench/inprocess.py, 5 interleaved pairs of 15,000-task drains): server CPU per task
-- relative to the worker's 0.98 -> 0.89 with these and two listing indexes gone; the listing
-- indexes stay (dashboard pages). On a large store the unique index is rebuilt once here.
ALTER TABLE status_transitions DROP CONSTRAINT status_transitions_seq_key;
ALTER TABLE task_events DROP CONSTRAINT task_events_seq_key;
DROP INDEX idx_status_transitions_entity;
DROP INDEX idx_status_transitions_idempotency;
CREATE UNIQUE INDEX idx_status_transitions_idempotency
  ON status_transitions(entity_id, idempotency_key);

-- 0007_lean_audit_indexes: why — every task writes two facts and two events, and each index of
-- theirs is one more b-tree insert per row on the drain's critical path (issue 7).
-- idx_status_transitions_entity (entity_id) held nothing the transition idempotency index does
-- not, once that index is not partial: it leads with entity_id, so a task's facts are found
-- through it. Every fact carries a key (TransitionRequest requires one) and a unique index treats
-- NULLs as distinct, so the full index enforces exactly what the partial one did (ADR-0072 D3:
-- one key per entity) and still serves ON CONFLICT (entity_id, idempotency_key) WHERE ...
-- idx_task_events_created: no statement reads events by time (a pruner of old events, which R11
-- would allow, can bound itself by rowid, which grows with time, or bring its own index): two
-- more b-tree inserts a task. PostgreSQL's 0007 also drops its UNIQUE on the identity column seq,
-- which SQLite (rowid) never had. On a large store the unique index is rebuilt once here.
DROP INDEX idx_status_transitions_entity;
DROP INDEX idx_task_events_created;
DROP INDEX idx_status_transitions_idempotency;
CREATE UNIQUE INDEX idx_status_transitions_idempotency
  ON status_transitions(entity_id, idempotency_key);

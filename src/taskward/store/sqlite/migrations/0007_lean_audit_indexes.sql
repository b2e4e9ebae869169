-- 0007_lean_audit_indexes: why — every task writes two facts, and each index of
-- status_transitions is one more b-tree insert per fact on the drain's critical path (issue 7).
-- idx_status_transitions_entity (entity_id) held nothing the transition idempotency index does
-- not, once that index is not partial: it leads with entity_id, so a task's facts are found
-- through it. Every fact carries a key (TransitionRequest requires one) and a unique index treats
-- NULLs as distinct, so the full index enforces exactly what the partial one did (ADR-0072 D3:
-- one key per entity) and still serves ON CONFLICT (entity_id, idempotency_key) WHERE ...
-- PostgreSQL's 0007 also drops its UNIQUE on the identity column seq, which SQLite (rowid) never
-- had. On a large store the unique index is rebuilt once here.
DROP INDEX idx_status_transitions_entity;
DROP INDEX idx_status_transitions_idempotency;
CREATE UNIQUE INDEX idx_status_transitions_idempotency
  ON status_transitions(entity_id, idempotency_key);

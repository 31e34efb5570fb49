-- Stage 4 (contract): no direct-DB worker remains; the global lock and the
-- shared round-robin row go. Rollback (004_stage4_contract.down.sql) recreates them.
DROP TABLE judge_dispatch_state;
DROP TABLE judge_nodes;

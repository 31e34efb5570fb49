-- Rollback of the worker pauses: every pause ends with the table.
DROP TABLE worker_pauses;

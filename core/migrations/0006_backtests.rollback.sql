-- Rolls back 0006_backtests.sql.
DROP TABLE backtests;
UPDATE tidegate_meta SET value = '5', updated_at = now() WHERE key = 'schema_version';

-- Rolls back 0003_lineage.sql.
DROP TABLE shadow_comparisons;
DROP TABLE served_requests;
UPDATE tidegate_meta SET value = '2', updated_at = now() WHERE key = 'schema_version';

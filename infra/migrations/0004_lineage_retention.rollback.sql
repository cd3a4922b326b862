-- Rolls back 0004_lineage_retention.sql.
DROP INDEX shadow_comparisons_compared_at;
DROP INDEX served_requests_completed_at;
UPDATE tidegate_meta SET value = '3', updated_at = now() WHERE key = 'schema_version';

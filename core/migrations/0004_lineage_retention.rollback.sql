-- Rolls back 0004_lineage_retention.sql.
-- transactional: false
DROP INDEX CONCURRENTLY IF EXISTS shadow_comparisons_compared_at;
DROP INDEX CONCURRENTLY IF EXISTS served_requests_completed_at;
UPDATE tidegate_meta SET value = '3', updated_at = now() WHERE key = 'schema_version';

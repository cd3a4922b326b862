-- Expiring the lineage tables (lifecycle/retention.py): the controller deletes rows older than
-- TIDEGATE_LIFECYCLE_LINEAGE_RETENTION_DAYS in small batches, found by these indexes.
-- depends: 0003_lineage

CREATE INDEX served_requests_completed_at ON served_requests (completed_at);
CREATE INDEX shadow_comparisons_compared_at ON shadow_comparisons (compared_at);

UPDATE tidegate_meta SET value = '4', updated_at = now() WHERE key = 'schema_version';

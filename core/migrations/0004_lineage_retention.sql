-- Expiring the lineage tables (lifecycle/retention.py): the controller deletes rows older than
-- TIDEGATE_LIFECYCLE_LINEAGE_RETENTION_DAYS in small batches, oldest first, along these indexes.
-- Built CONCURRENTLY (so outside a transaction): the tables may be large by now, and a plain
-- CREATE INDEX would hold the indexer's inserts for the whole build.
-- depends: 0003_lineage
-- transactional: false

CREATE INDEX CONCURRENTLY IF NOT EXISTS served_requests_completed_at
    ON served_requests (completed_at);
CREATE INDEX CONCURRENTLY IF NOT EXISTS shadow_comparisons_compared_at
    ON shadow_comparisons (compared_at);

UPDATE tidegate_meta SET value = '4', updated_at = now() WHERE key = 'schema_version';

-- Rolls back 0005_lineage_sources.sql. Dropping columns only marks them dropped in the catalog
-- (no rewrite); the space is reclaimed as rows are updated or the table is vacuumed full.
SET LOCAL lock_timeout = '10s';
DROP TABLE request_id_conflicts;
ALTER TABLE served_requests
    DROP COLUMN history,
    DROP COLUMN origin_offset,
    DROP COLUMN origin_partition,
    DROP COLUMN origin_topic,
    DROP COLUMN attempt,
    DROP COLUMN request_digest,
    DROP COLUMN request_schema_id,
    DROP COLUMN source_offset,
    DROP COLUMN source_partition,
    DROP COLUMN source_topic;
UPDATE tidegate_meta SET value = '4', updated_at = now() WHERE key = 'schema_version';

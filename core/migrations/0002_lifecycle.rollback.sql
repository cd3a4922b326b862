-- Rolls back 0002_lifecycle.sql.
DROP TABLE version_lineage;
DROP TABLE version_history;
DROP TABLE routing_rules;
DROP TABLE routing_versions;
DROP TABLE lifecycle_models;
DROP TABLE outbox;
DROP TABLE events;
DROP FUNCTION events_append_only();
DROP TABLE streams;
UPDATE tidegate_meta SET value = '1', updated_at = now() WHERE key = 'schema_version';

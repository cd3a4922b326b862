-- Rolls back 0007_api_keys.sql. Every issued key stops working.
DROP TABLE api_keys;
UPDATE tidegate_meta SET value = '6', updated_at = now() WHERE key = 'schema_version';

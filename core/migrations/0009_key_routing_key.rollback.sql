-- Rolls back 0009_key_routing_key.sql. Keys that named a routing key then take the caller's.
ALTER TABLE api_keys DROP COLUMN routing_key;
UPDATE tidegate_meta SET value = '8', updated_at = now() WHERE key = 'schema_version';

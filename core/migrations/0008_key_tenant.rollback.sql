-- Rolls back 0008_key_tenant.sql. Keys that named a tenant then act for any.
ALTER TABLE api_keys DROP COLUMN tenant;
UPDATE tidegate_meta SET value = '7', updated_at = now() WHERE key = 'schema_version';

-- A key may act for one tenant (issue 20): `tidegate auth keys create --tenant acme`. A call
-- with such a key is that tenant's whatever its `tenant` parameter says (another tenant's is
-- refused, 403), so its routing rules, prediction cache entries and lineage are that tenant's.
-- NULL: the key names no tenant, and the caller's parameter (else `default`) stands.
-- depends: 0007_api_keys

ALTER TABLE api_keys
    ADD COLUMN tenant text CHECK (tenant IS NULL OR length(tenant) BETWEEN 1 AND 200);

UPDATE tidegate_meta SET value = '8', updated_at = now() WHERE key = 'schema_version';

-- A key may name the routing key of its calls (issue 20): `tidegate auth keys create
-- --routing-key card-42`. A call with such a key has that routing key whatever its
-- `routing_key` parameter says (another is refused, 403), so its caller cannot pick its own side
-- of a weighted split, or the partition it lands on. NULL: the caller's parameter stands.
-- depends: 0008_key_tenant

ALTER TABLE api_keys
    ADD COLUMN routing_key text CHECK (routing_key IS NULL OR length(routing_key) BETWEEN 1 AND 200);

UPDATE tidegate_meta SET value = '9', updated_at = now() WHERE key = 'schema_version';

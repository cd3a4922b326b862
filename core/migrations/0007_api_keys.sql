-- API keys (issue 11): the keys tidegate issues for the gateway (`tidegate auth keys create`,
-- gateway/auth/api_keys.py; docs/security.md). A key is `tg_<id>_<secret>`; only an argon2id hash of
-- the secret is kept (`secret_hash`, the PHC string argon2-cffi writes, parameters included), so
-- a copy of this table lets nobody call the gateway. The key is shown once, when created.
--
-- `grants` is the key's roles, each over all models or named ones:
-- [{"role": "infer", "models": null}, {"role": "deploy", "models": ["fraud"]}].
-- `rate_per_s` overrides the gateway's rate limit for this key (NULL: the configured one).
-- Revoking sets `revoked_at` (rows are never deleted: the audit trail names key ids); every
-- gateway replica reads a key's row again at most TIDEGATE_AUTH_REVOCATION_S after it last did,
-- so a revoked or expired key is refused everywhere within seconds.
-- depends: 0006_backtests

CREATE TABLE api_keys (
    id          text PRIMARY KEY CHECK (id ~ '^[a-z0-9]{8,32}$'),
    name        text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    secret_hash text NOT NULL,
    grants      jsonb NOT NULL CHECK (jsonb_typeof(grants) = 'array'),
    rate_per_s  double precision CHECK (rate_per_s IS NULL OR rate_per_s > 0),
    created_at  timestamptz NOT NULL DEFAULT now(),
    created_by  text NOT NULL,
    expires_at  timestamptz,
    revoked_at  timestamptz,
    revoked_by  text,
    CHECK (expires_at IS NULL OR expires_at > created_at),
    CHECK ((revoked_at IS NULL) = (revoked_by IS NULL))
);

-- `tidegate auth keys list` shows the newest first.
CREATE INDEX api_keys_created ON api_keys (created_at DESC);

UPDATE tidegate_meta SET value = '7', updated_at = now() WHERE key = 'schema_version';

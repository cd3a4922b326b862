-- Stack metadata, starting with the schema version of the stack's database.
-- Applied by `bash infra/stack.sh up` with yoyo-migrations; later migrations bump schema_version.

CREATE TABLE tidegate_meta (
    key text PRIMARY KEY,
    value text NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

INSERT INTO tidegate_meta (key, value) VALUES ('schema_version', '1');

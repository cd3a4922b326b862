-- The lineage tables the controller's indexer fills from Kafka: which version served each request
-- (results topic) and how shadow candidates compared with the primary (shadow topic).
-- Rows are keyed by request so a redelivered record is inserted once (ON CONFLICT DO NOTHING).
-- depends: 0002_lifecycle

CREATE TABLE served_requests (
    request_id   text PRIMARY KEY,
    model        text NOT NULL,
    version      text,                       -- NULL when no version served (e.g. NOT_FOUND)
    status       text NOT NULL,
    worker_id    text NOT NULL DEFAULT '',
    routing_rule text,
    tenant       text NOT NULL DEFAULT 'default',
    routing_key  text,
    completed_at timestamptz NOT NULL,
    total_ms     double precision NOT NULL DEFAULT 0,
    error_code   text,
    indexed_at   timestamptz NOT NULL DEFAULT now()
);

-- Seeding the live canary windows after a restart reads recent results per version.
CREATE INDEX served_requests_version_time ON served_requests (model, version, completed_at);

CREATE TABLE shadow_comparisons (
    model             text NOT NULL,
    candidate_version text NOT NULL,
    request_id        text NOT NULL,
    primary_version   text NOT NULL,
    kind              text NOT NULL,         -- classifier | embedding | other
    rows              integer NOT NULL,
    agree_rows        bigint,                -- classifiers only
    abs_diff_sum      double precision NOT NULL DEFAULT 0,
    value_count       bigint NOT NULL DEFAULT 0,  -- the record's `values` (a reserved word in SQL)
    cosine_sum        double precision,      -- embeddings only
    primary_ms        double precision NOT NULL DEFAULT 0,
    candidate_ms      double precision NOT NULL DEFAULT 0,
    candidate_error   text,
    worker_id         text NOT NULL DEFAULT '',
    compared_at       timestamptz NOT NULL,
    indexed_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (model, candidate_version, request_id)
);

UPDATE tidegate_meta SET value = '3', updated_at = now() WHERE key = 'schema_version';

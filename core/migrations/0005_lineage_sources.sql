-- Lineage, completed (issue 10): where each served request was read, with which schema and
-- content, and every retry, redrive or replay that led to the result `tidegate served` shows.
--
-- `served_requests` gains the result's lineage fields (dev.tidegate.inference.InferenceResult):
-- the source position, the request's schema id and digest (BLAKE2b-128 hex of its body), the
-- delivery attempt, the first position when the result comes from a redelivery (origin), and
-- the redelivery steps as JSON, oldest first ([{kind, at, from, id, reason}]).
--
-- Cheap on a large table: since PostgreSQL 11 adding a nullable column, or one whose default is
-- a constant (`attempt`'s 1, `history`'s '[]'), only changes the catalog; no row is rewritten,
-- and the ACCESS EXCLUSIVE lock lasts milliseconds. Rows indexed before this migration read as a
-- first attempt with no history and unknown source. The lock_timeout makes the migration fail
-- (to be run again) rather than queue behind a long query and stall the indexer's inserts.
--
-- `request_id_conflicts` records a request id that arrived again with other content (both
-- digests known and different): the served row keeps the first result, the other one is listed
-- here once per (request id, digest), however often it is redelivered. Its rows go with their
-- served row (ON DELETE CASCADE), so the lineage retention expires them too.
-- depends: 0004_lineage_retention

SET LOCAL lock_timeout = '10s';

ALTER TABLE served_requests
    ADD COLUMN source_topic      text,
    ADD COLUMN source_partition  integer,
    ADD COLUMN source_offset     bigint,
    ADD COLUMN request_schema_id integer,
    ADD COLUMN request_digest    text,
    ADD COLUMN attempt           integer NOT NULL DEFAULT 1,
    ADD COLUMN origin_topic      text,
    ADD COLUMN origin_partition  integer,
    ADD COLUMN origin_offset     bigint,
    ADD COLUMN history           jsonb NOT NULL DEFAULT '[]';

CREATE TABLE request_id_conflicts (
    request_id       text NOT NULL REFERENCES served_requests (request_id) ON DELETE CASCADE,
    digest           text NOT NULL,          -- the conflicting result's request_digest
    first_digest     text NOT NULL,          -- the served row's, when the conflict was detected
    model            text NOT NULL,
    version          text,
    status           text NOT NULL,
    worker_id        text NOT NULL DEFAULT '',
    source_topic     text,
    source_partition integer,
    source_offset    bigint,
    completed_at     timestamptz NOT NULL,
    detected_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (request_id, digest)
);

UPDATE tidegate_meta SET value = '5', updated_at = now() WHERE key = 'schema_version';

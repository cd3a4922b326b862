-- The event-sourced model lifecycle (lifecycle/store.py, outbox.py, projections.py).
--
-- `events` is the append-only log and the only source of truth; `streams` holds each stream's
-- version so that an append can check it under a row lock; `outbox` lists the events still to be
-- published to Kafka; every other table here is a projection, rebuilt from `events` alone.
-- No table names a schema: tests apply these migrations into a schema of their own.
-- depends: 0001_init

CREATE TABLE streams (
    stream text PRIMARY KEY,
    -- The sequence of the stream's last event (0: none yet): the expected-version check.
    version bigint NOT NULL DEFAULT 0 CHECK (version >= 0),
    -- occurred_at of the last event: a later append never goes back in time, so a time-travel
    -- read (`occurred_at <= T`) always sees a prefix of the stream.
    updated_at timestamptz NOT NULL DEFAULT '-infinity'
);

CREATE TABLE events (
    position bigserial PRIMARY KEY,
    event_id uuid NOT NULL UNIQUE,
    stream text NOT NULL REFERENCES streams (stream),
    sequence bigint NOT NULL CHECK (sequence >= 1),
    type text NOT NULL,
    payload jsonb NOT NULL,
    actor text NOT NULL,
    occurred_at timestamptz NOT NULL,
    causation_id uuid,
    correlation_id uuid,
    -- The backstop of the expected-version check: two writers can never both get a sequence.
    CONSTRAINT events_stream_sequence_key UNIQUE (stream, sequence)
);

CREATE INDEX events_stream_occurred_at ON events (stream, occurred_at);

-- Append-only, enforced by the database: history is never rewritten, whoever connects.
CREATE FUNCTION events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'lifecycle events are append-only (% refused)', TG_OP;
END
$$;

CREATE TRIGGER events_no_update_delete BEFORE UPDATE OR DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION events_append_only();

CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events
    FOR EACH STATEMENT EXECUTE FUNCTION events_append_only();

-- One row per event, written in the append's transaction; the relay sets published_at once
-- Kafka acknowledged it. A crash in between leaves it NULL, so the event is published again.
CREATE TABLE outbox (
    position bigint PRIMARY KEY REFERENCES events (position),
    published_at timestamptz
);

CREATE INDEX outbox_unpublished ON outbox (position) WHERE published_at IS NULL;

-- Projections: rewritten per stream from lifecycle.state.fold inside every append.

CREATE TABLE lifecycle_models (
    model text PRIMARY KEY,
    sequence bigint NOT NULL,
    primary_version text,
    previous_primary text,
    canary_version text,
    canary_baseline text,
    canary_steps integer[],
    canary_step integer,
    canary_dwell_s double precision,
    canary_thresholds jsonb,
    canary_started_at timestamptz,
    canary_step_at timestamptz,
    updated_at timestamptz
);

CREATE TABLE routing_versions (
    model text NOT NULL,
    version text NOT NULL,
    status text NOT NULL,
    -- Intended weight (percent) and the weight in force once unwarmed versions' share went to
    -- the primary (ModelState.effective_weights).
    weight integer NOT NULL,
    effective_weight integer NOT NULL,
    shadow_rate double precision,
    ready boolean NOT NULL,
    loaded_on text[] NOT NULL,
    runtime text NOT NULL,
    updated_at timestamptz,
    PRIMARY KEY (model, version)
);

CREATE TABLE routing_rules (
    model text NOT NULL,
    rule_id text NOT NULL,
    tenant text,
    version text,
    weights jsonb NOT NULL,
    PRIMARY KEY (model, rule_id)
);

CREATE TABLE version_history (
    model text NOT NULL,
    sequence bigint NOT NULL,
    position bigint NOT NULL,
    occurred_at timestamptz NOT NULL,
    type text NOT NULL,
    version text,
    actor text NOT NULL,
    summary text NOT NULL,
    payload jsonb NOT NULL,
    correlation_id uuid,
    PRIMARY KEY (model, sequence)
);

CREATE TABLE version_lineage (
    model text NOT NULL,
    version text NOT NULL,
    runtime text NOT NULL,
    artifact_uri text NOT NULL,
    sha256 jsonb NOT NULL,
    description text NOT NULL,
    registered_by text NOT NULL,
    registered_at timestamptz NOT NULL,
    validated_at timestamptz,
    validation_failed_at timestamptz,
    failure_reason text,
    shadow_started_at timestamptz,
    canary_started_at timestamptz,
    promoted_at timestamptz,
    promoted_by text,
    promoted_forced boolean,
    rolled_back_at timestamptz,
    rollback_reason text,
    retired_at timestamptz,
    retired_by text,
    correlation_ids uuid[] NOT NULL,
    PRIMARY KEY (model, version)
);

UPDATE tidegate_meta SET value = '2', updated_at = now() WHERE key = 'schema_version';

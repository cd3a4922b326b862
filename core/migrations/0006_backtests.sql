-- Backtest outcomes (issue 10): one row per `tidegate backtest` run, a candidate version re-scored
-- on a time range of served requests next to what was served (dlq/backtest_report.py builds the
-- report, lifecycle/readmodels/backtests.py writes and reads the rows). The promotion gate reads
-- the latest row of a candidate when TIDEGATE_LIFECYCLE_REQUIRE_BACKTEST is on (docs/backtest.md).
--
-- The gate's numbers are columns, so the gate never parses the report; the whole report (the
-- JSON `tidegate backtest` saves) is kept beside them for `models compare` and for people.
-- Rows are few (one per operator run) and never expire with the lineage tables.
-- depends: 0005_lineage_sources

CREATE TABLE backtests (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    model             text NOT NULL,
    candidate_version text NOT NULL,
    baseline_versions text[] NOT NULL DEFAULT '{}',   -- the versions that served the range
    window_from       timestamptz NOT NULL,
    window_to         timestamptz NOT NULL,
    task              text NOT NULL,                  -- classifier | embedding | other
    requests          bigint NOT NULL,
    rows_compared     bigint NOT NULL,
    candidate_errors  bigint NOT NULL,
    missing_served    bigint NOT NULL,
    agreement         double precision,               -- classifiers only
    mean_cosine       double precision,               -- embeddings only
    max_abs_diff      double precision,               -- NULL when nothing was compared
    report            jsonb NOT NULL,
    actor             text NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT now(),
    CHECK (window_from <= window_to)
);

-- The gate asks for a candidate's latest backtest.
CREATE INDEX backtests_latest ON backtests (model, candidate_version, created_at DESC, id DESC);

UPDATE tidegate_meta SET value = '6', updated_at = now() WHERE key = 'schema_version';

"""Fixture modules, registered once for every suite (as quixstreams registers its own), rather
than each test module importing fixtures from another module. A test module's own fixture of
the same name overrides one of these."""

# In import order: a module another one imports comes first, so that its asserts are rewritten.
pytest_plugins = [
    "tests.unit.gateway_harness",
    "tests.integration.workers",
    "tests.integration.own_broker",
    "tests.integration.gateway.gateway_fixtures",
    "tests.integration.dlq.dlq_fixtures",
    "tests.integration.dlq.replay_fixtures",
]

"""A call's round trip through Kafka: publishing its request, this replica's leased partition of
the replies topic, routing each reply to the call that waits for it, and the result store where
the results of asynchronous (or timed-out) calls wait to be fetched."""

__all__: list[str] = []

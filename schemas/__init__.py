"""Avro schemas of tidegate (`catalog`), the codec that speaks the Confluent wire format (`codec`,
`wire`), the registry domain (`registry`) and the V2 records (`tensors`, `signature`, `v2`,
`v2_binary`, `requests`).

The package itself imports nothing: the V2 records are pure and must stay cheap to import, while
the codec brings confluent-kafka and fastavro. Import each module by name.
"""

__all__: list[str] = []

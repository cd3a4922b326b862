"""The V2 inference protocol over HTTP: thin routes, the HTTP edge (`v2_http`), the data plane
on plain values (`infer`), the records it publishes (`call_record`) and the responses it renders,
and the running state of one replica (`gateway_runtime`)."""

__all__: list[str] = []

"""The reply router: a reply someone waits for goes to that call and nowhere else; results the
gateway promised to keep go to the store; any other reply is attached only to a request the store
knows."""

from __future__ import annotations

import asyncio

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.unit.gateway_harness import MemoryStore
from tidegate.core.telemetry_settings import TracingSettings
from tidegate.core.tracing import context_from_headers, span_headers, start_tracing
from tidegate.gateway.admission.admission_control import Admission
from tidegate.gateway.roundtrip.reply_router import ReplyRouter
from tidegate.gateway.roundtrip.result_store import StoredRequest
from tidegate.schemas.records import ResultRecord


def result(request_id: str, worker_id: str = "w-1") -> ResultRecord:
    """A minimal result; `worker_id` tells the copies of one result apart."""
    return {
        "request_id": request_id,
        "model": "m",
        "status": "OK",
        "completed_at": 0,
        "worker_id": worker_id,
    }


def router(store: MemoryStore, *, keep_s: float = 60.0, max_kept: int = 100) -> ReplyRouter:
    return ReplyRouter(store, keep_s=keep_s, max_kept=max_kept)


async def test_an_awaited_reply_resolves_its_call_and_touches_no_store() -> None:
    store = MemoryStore()
    replies = router(store)
    future = replies.expect("mine")
    replies.deliver(result("mine"), b"raw")
    assert (await future)["request_id"] == "mine"
    await replies.drain()
    assert store.calls == []
    assert not replies.is_waiting("mine")


async def test_kept_results_are_stored_and_others_only_attached_to_known_requests() -> None:
    store = MemoryStore()
    store.requests["elsewhere"] = StoredRequest({"model": "fraud"}, None)
    replies = router(store)
    replies.keep("kept")
    replies.deliver(result("kept"), b"raw-kept")
    replies.deliver(result("elsewhere"), b"raw-elsewhere")
    replies.deliver(result("stranger"), b"raw-stranger")
    await replies.drain()
    assert store.requests["kept"].result == b"raw-kept"
    assert store.requests["elsewhere"] == StoredRequest({"model": "fraud"}, b"raw-elsewhere")
    assert "stranger" not in store.requests
    assert store.calls == [("save", "kept"), ("attach", "elsewhere"), ("attach", "stranger")]


async def test_a_dropped_request_is_no_longer_kept() -> None:
    store = MemoryStore()
    replies = router(store)
    replies.keep("gone")
    replies.drop("gone")
    replies.deliver(result("gone"), b"raw")
    await replies.drain()
    assert store.calls == [("attach", "gone")]
    assert store.requests == {}


async def test_kept_ids_are_bounded_in_number_and_time() -> None:
    store = MemoryStore()
    few = router(store, max_kept=2)
    for request_id in ("a", "b", "c"):
        few.keep(request_id)
    for request_id in ("a", "b", "c"):
        few.deliver(result(request_id), b"raw")
    await few.drain()
    assert store.calls == [("attach", "a"), ("save", "b"), ("save", "c")]

    store = MemoryStore()
    brief = router(store, keep_s=0.01)
    brief.keep("x")
    await asyncio.sleep(0.05)
    brief.deliver(result("x"), b"raw")
    await brief.drain()
    assert store.calls == [("attach", "x")]


async def test_a_late_reply_after_its_call_ended_is_stored_when_kept() -> None:
    store = MemoryStore()
    replies = router(store)
    future = replies.expect("late")
    future.set_exception(TimeoutError())
    replies.keep("late")
    replies.forget("late", future)
    replies.deliver(result("late"), b"raw")
    await replies.drain()
    assert store.requests["late"].result == b"raw"
    assert store.calls == [("save", "late")]
    assert isinstance(future.exception(), TimeoutError)


async def test_a_reply_in_the_same_moment_as_the_deadline_is_stored() -> None:
    """The deadline failed the call's future, and the reply is handed over before the call could
    resume to say `keep`: the result is stored all the same."""
    store = MemoryStore()
    replies = router(store)
    future = replies.expect("edge")
    future.set_exception(TimeoutError())
    replies.deliver(result("edge"), b"raw")
    await replies.drain()
    assert store.calls == [("save", "edge")]
    assert isinstance(future.exception(), TimeoutError)


async def test_forget_cancels_and_spares_a_later_call_of_the_same_id() -> None:
    replies = router(MemoryStore())
    first: asyncio.Future[ResultRecord] = replies.expect("x")
    replies.forget("x", first)
    assert first.cancelled()
    assert not replies.is_waiting("x")
    stale = replies.expect("y")
    replies.deliver(result("y"), b"raw")
    newer = replies.expect("y")
    replies.forget("y", stale)
    assert replies.is_waiting("y")
    assert not newer.done()


async def test_listeners_see_every_reply() -> None:
    replies = router(MemoryStore())
    admission = Admission(10)
    replies.listeners.append(admission.on_result)
    admission.admit("async", ttl_s=60)
    replies.keep("async")
    replies.deliver(result("async"), b"raw")
    await replies.drain()
    assert admission.in_flight == 0


async def test_a_redelivered_reply_answers_its_caller_once() -> None:
    # At-least-once workers publish a result twice when one dies between producing and
    # committing: the caller gets the first copy, the second answers nobody and breaks nothing.
    store = MemoryStore()
    replies = router(store)
    future = replies.expect("dup")
    replies.deliver(result("dup", worker_id="copy-1"), b"one")
    replies.deliver(result("dup", worker_id="copy-2"), b"two")
    assert (await future)["worker_id"] == "copy-1"
    await replies.drain()
    assert not replies.is_waiting("dup")
    assert "dup" not in store.requests, "the copy of an answered sync call was stored"
    later = replies.expect("dup")  # a new call reusing the id waits for its own result
    await asyncio.sleep(0)
    assert not later.done()
    replies.forget("dup")


async def test_with_tracing_a_reply_is_a_span_under_the_workers_context() -> None:
    exporter = InMemorySpanExporter()
    tracer = start_tracing(TracingSettings(enabled=True), "gateway", exporter=exporter).tracer
    assert tracer is not None
    worker_span = tracer.start_span("process requests")
    carried = context_from_headers(span_headers(worker_span))
    replies = ReplyRouter(MemoryStore(), keep_s=60.0, max_kept=10, tracer=tracer)
    future = replies.expect("traced")
    replies.deliver(result("traced"), b"raw", carried)
    replies.deliver(result("untraced"), b"raw")  # a reply without context: no span
    await future
    await replies.drain()
    (reply,) = exporter.get_finished_spans()
    assert reply.name == "reply"
    assert reply.parent is not None
    assert reply.parent.span_id == worker_span.get_span_context().span_id
    assert dict(reply.attributes or {}) == {
        "tidegate.request_id": "traced",
        "tidegate.reply": "awaited",
    }


async def test_stored_results_are_their_callers_and_attach_never_replaces_one() -> None:
    store = MemoryStore()
    store.requests["done"] = StoredRequest({"model": "fraud"}, b"first", "key:a")
    replies = router(store)
    replies.keep("kept", "key:a")
    replies.deliver(result("kept"), b"raw-kept")
    late = replies.expect("late", "key:b")
    late.cancel()  # its call ended at the deadline and has not said `keep` yet
    replies.deliver(result("late"), b"raw-late")
    replies.deliver(result("done"), b"duplicate")  # nobody waits: only attached
    replies.keep("done", "key:mallory")  # a reused id: the store refuses the write
    replies.deliver(result("done"), b"forged")
    await replies.drain()
    assert store.requests["kept"] == StoredRequest(None, b"raw-kept", "key:a")
    assert store.requests["late"] == StoredRequest(None, b"raw-late", "key:b")
    assert store.requests["done"] == StoredRequest({"model": "fraud"}, b"first", "key:a")


async def test_a_reply_reaches_only_the_submission_whose_nonce_it_carries() -> None:
    store = MemoryStore()
    store.requests["kept"] = StoredRequest({"model": "fraud"}, None, "key:a", "n-kept")
    replies = router(store)
    future = replies.expect("order-123", "key:m", "n-mallory")
    # Another submission's reply with the same id (or a forged one, without a nonce): not hers.
    replies.deliver(result("order-123", worker_id="alice"), b"alice", None, "n-alice")
    replies.deliver(result("order-123", worker_id="forged"), b"forged", None, None)
    assert not future.done()
    replies.deliver(result("order-123", worker_id="hers"), b"hers", None, "n-mallory")
    assert (await future)["worker_id"] == "hers"
    # A kept request takes only its own submission's result, in the router and in the store.
    replies.keep("kept", "key:a", "n-kept")
    replies.deliver(result("kept"), b"wrong", None, "n-other")
    await replies.drain()
    assert store.requests["kept"].result is None
    replies.deliver(result("kept"), b"right", None, "n-kept")
    await replies.drain()
    assert store.requests["kept"].result == b"right"

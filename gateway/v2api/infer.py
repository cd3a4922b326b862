"""The gateway's data plane (`Inference`): one inference call, from an `InferCall` of plain values
to an `Outcome` the HTTP edge renders; it never sees a header or a response.
Sync calls: docs/decisions/009-gateway-hot-path.md ("Decision"); async calls and retries:
docs/deadlines-and-faults.md ("Asynchronous calls: accepted or refused, never half-accepted");
ids and owners: docs/security.md ("Results by id belong to their caller").
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.trace import Tracer

from tidegate.clients.producer import Lane
from tidegate.core.errors import ModelUnavailableError, ResultTimeoutError, TidegateError
from tidegate.gateway import http_metrics
from tidegate.gateway.admission.admission_control import Admission
from tidegate.gateway.auth.identity import Identity
from tidegate.gateway.gateway_services import GatewayServices
from tidegate.gateway.gateway_settings import GatewaySettings
from tidegate.gateway.http_errors import (
    RequestIdTakenError,
    RequestInFlightError,
    RequestNotFoundError,
    StoreUnavailableError,
)
from tidegate.gateway.roundtrip.reply_router import ReplyRouter
from tidegate.gateway.v2api import call_record
from tidegate.gateway.v2api.body import check_elements
from tidegate.gateway.v2api.call_deadline import CallDeadline
from tidegate.gateway.v2api.responses import OutputPrefs
from tidegate.schemas.records import RequestRecord, ResultRecord
from tidegate.schemas.requests import fallback_allowed
from tidegate.schemas.signature import validate_inputs
from tidegate.schemas.v2 import input_records, parse_request
from tidegate.schemas.v2_binary import split_body

__all__ = ["UNKNOWN_MODEL", "InferCall", "Inference", "Outcome", "Stored"]

_log = logging.getLogger(__name__)

# The marker's flag of an asynchronous request whose publish is not acknowledged yet.
_PUBLISHING = "publishing"
# A synchronous call's reservation of the id its caller chose outlasts its wait by this much:
# a 504 turns it into the kept marker within it.
_RESERVE_S = 5.0

# The metric label of calls for no model this gateway serves: made-up names never become series.
UNKNOWN_MODEL = "_unknown"


@dataclass(frozen=True, slots=True)
class InferCall:
    """One inference call as the edge read it: the path's model and version, the body, and the
    raw values of `Inference-Header-Content-Length`, `Request-Timeout` and `Tidegate-Lane`, and
    `owner`, the subject of the caller, recorded with a result the gateway keeps."""

    model: str
    version: str | None
    body: bytes
    header_length: str | None = None
    timeout: str | None = None
    respond_async: bool = False
    owner: str | None = None
    lane: str | None = None
    tenant: str | None = None
    """The tenant the caller's identity acts for, if it names one (`Identity.tenant`)."""
    routing_key: str | None = None
    """The routing key the caller's identity names, if any (`Identity.routing_key`)."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a call ended: a result (synchronous), accepted (asynchronous), or an error. `model` and
    `version` are metric labels: a served model and its version, else `UNKNOWN_MODEL` and ''."""

    request_id: str | None
    model: str = UNKNOWN_MODEL
    version: str = ""
    result: ResultRecord | None = None
    prefs: OutputPrefs = field(default_factory=OutputPrefs)
    accepted: bool = False
    error: TidegateError | None = None


@dataclass(frozen=True, slots=True)
class Stored:
    """A request fetched by id: its result, or None while it is pending."""

    result: ResultRecord | None
    prefs: OutputPrefs


class Inference:
    def __init__(
        self,
        settings: GatewaySettings,
        services: GatewayServices,
        router: ReplyRouter,
        admission: Admission,
    ) -> None:
        self._settings = settings
        self._services = services
        self._router = router
        self._admission = admission
        # Asynchronous requests this replica is publishing now, by id: a retry racing its
        # first attempt here is told so before either reads Redis.
        self._submitting: set[str] = set()

    @property
    def max_body_bytes(self) -> int:
        return self._settings.body_limit

    @property
    def tracer(self) -> Tracer | None:
        """The gateway's tracer; None when tracing is off."""
        return self._services.tracing.tracer

    def shed(self) -> None:
        """Refuse at once, before a body is read, when no call could be admitted."""
        self._admission.check()

    async def infer(self, call: InferCall) -> Outcome:
        request_id: str | None = None
        model, version = UNKNOWN_MODEL, ""
        try:
            header, binary = split_body(call.body, call.header_length)
            check_elements(header, self._settings.max_record_bytes)
            v2 = parse_request(header)
            lane = call_record.lane(call.lane, v2.parameters)
            request_id = call_record.request_id(v2.id)
            if v2.id:
                self._check_held_here(request_id, call.owner)
            signature = await self._services.catalog.signature(call.model, call.version)
            model, version = call.model, call.version or ""
            inputs = input_records(v2, binary, signature)
            budget = call_record.budget(
                call.timeout, self._settings, respond_async=call.respond_async
            )
            reply_to = self._services.feed.reply_to()
            record = call_record.new_record(
                model,
                call.version,
                v2,
                inputs,
                request_id,
                reply_to,
                budget.deadline_s,
                call_record.new_nonce(),
                call.tenant,
                call.routing_key,
            )
            prefs = OutputPrefs.from_request(v2)
            if call.respond_async:
                await self._submit(record, prefs, call.owner, chosen=bool(v2.id), lane=lane)
                return Outcome(request_id, model, version, prefs=prefs, accepted=True)
            result = await self._cached(record)
            if result is None:
                record = await self._divert(record, budget.wait_s, lane)
                result = await self._call(
                    record, prefs, budget.wait_s, call.owner, lane, chosen=bool(v2.id)
                )
            model = str(result.get("model") or model)
            served = str(result.get("model_version") or version)
            return Outcome(request_id, model, served, result=result, prefs=prefs)
        except TidegateError as exc:
            return Outcome(request_id, model, version, error=exc)

    def _check_held_here(self, request_id: str, owner: str | None) -> None:
        """Refuse an id a call on this replica waits for or keeps (409) before Redis is asked:
        another caller's is taken, the same caller's synchronous one still in flight."""
        held, holder = self._router.holder(request_id)
        if not held:
            return
        if holder != owner:
            raise RequestIdTakenError(request_id)
        if self._router.is_waiting(request_id):
            raise RequestInFlightError(request_id)

    async def _cached(self, record: RequestRecord) -> ResultRecord | None:
        """The answer from the prediction cache, when the model opted in and the version that
        would serve it is certain; it then skips admission, Kafka and the model."""
        cache, resolve = self._services.prediction_cache, self._services.resolve_version
        if cache is None or resolve is None:
            return None
        return await cache.lookup(str(record["model"]), resolve, record)

    async def _divert(
        self, record: RequestRecord, wait_s: float | None, lane: Lane
    ) -> RequestRecord:
        """`record`, or the same request for the model's declared fallback when every servable
        version's breaker is open or (with `wait_s`) admission would refuse it, and the caller
        allows a fallback. With every breaker open and no fallback to take it, the call is
        refused at once (503 with the breakers' `Retry-After`); a call admission would refuse
        is left to `admit`, which says why. Two O(1) checks when neither is the case."""
        model = str(record["model"])
        health = self._services.health
        broken = health is not None and health.suspect(model)
        catalog = self._services.catalog
        crowded = (
            wait_s is not None
            and self._admission.refusal(model, wait_s, lane) is not None
            and catalog.has_fallback(model)  # else `admit` refuses it, with its reason
        )
        if not (broken or crowded):
            return record
        servable, fallback = await catalog.routes(model, record.get("model_version"))
        reopens = health.refusing(model, servable) if health is not None and broken else None
        if reopens is None and not crowded:
            return record
        reason = "overloaded" if reopens is None else "breaker-open"
        if (
            fallback is not None
            and fallback != model
            and record.get("model_version") is None
            and fallback_allowed(record.get("parameters"))
            and await self._takes(fallback, record, wait_s, lane)
        ):
            http_metrics.FALLBACKS.labels(model, fallback, reason).inc()
            return call_record.divert(record, fallback, reason)
        if reopens is not None:
            raise ModelUnavailableError(
                f"every servable version of {model!r} has its circuit breaker open, and no "
                "fallback model took the call",
                retry_after_s=reopens,
            )
        return record

    async def _takes(
        self, fallback: str, record: RequestRecord, wait_s: float | None, lane: Lane
    ) -> bool:
        """Whether the fallback model could serve this call now: it is served, has room, its
        breakers let calls through, and its signature takes the call's inputs and outputs (a
        call the fallback would reject is better refused, retriable, than answered invalid)."""
        if wait_s is not None and self._admission.refusal(fallback, wait_s, lane) is not None:
            return False
        health = self._services.health
        catalog = self._services.catalog
        try:
            servable, _ = await catalog.routes(fallback, None)
            signature = await catalog.signature(fallback)
            validate_inputs(signature, record["inputs"])
        except TidegateError:
            return False  # not served (any more), or another signature
        known = {spec.name for spec in signature.outputs}
        if not known.issuperset(record.get("outputs") or ()):
            return False
        return health is None or health.refusing(fallback, servable) is None

    async def _submit(
        self,
        record: RequestRecord,
        prefs: OutputPrefs,
        owner: str | None,
        *,
        chosen: bool,
        lane: Lane = "realtime",
    ) -> None:
        """Return once Kafka has the request (or had it already, for a retry of an id the
        caller chose); raise when it does not, and then it never will."""
        request_id = str(record["request_id"])
        if request_id in self._submitting:
            raise RequestInFlightError(request_id)
        self._submitting.add(request_id)
        try:
            if chosen and await self._accepted_before(request_id, owner):
                return
            record = await self._divert(record, None, lane)
            await self._publish_kept(record, prefs, owner, lane)
        finally:
            self._submitting.discard(request_id)

    async def _accepted_before(self, request_id: str, owner: str | None) -> bool:
        """Whether an earlier call with this id was accepted; raises if it is another
        caller's, or still being published."""
        stored = await self._services.store.get(request_id)
        if stored is None:
            return False
        if stored.owner != owner:
            raise RequestIdTakenError(request_id)
        if stored.result is None and (stored.meta is None or stored.meta.get(_PUBLISHING)):
            # Being published, or reserved by a synchronous call that still waits.
            raise RequestInFlightError(request_id)
        return True

    async def _publish_kept(
        self, record: RequestRecord, prefs: OutputPrefs, owner: str | None, lane: Lane
    ) -> None:
        request_id = str(record["request_id"])
        publisher, store = self._services.publisher, self._services.store
        # Not even the marker is written while Kafka is unreachable.
        publisher.check()
        self._admission.admit(
            request_id, ttl_s=self._settings.max_timeout_s, model=record["model"], lane=lane
        )
        nonce = _nonce(record)
        try:
            await store.save(
                request_id,
                meta=_meta(record, prefs, publishing=True),
                owner=owner,
                nonce=nonce,
                claim=True,
            )
            self._router.keep(request_id, owner, nonce)
            try:
                # No timeout of our own: librdkafka settles it within `publish_timeout_s`, and
                # giving up sooner would leave a request Kafka may still take.
                await publisher.submit(record, lane)
            except TidegateError:
                self._router.drop(request_id)
                await store.discard(request_id)
                raise
        except BaseException:
            self._admission.release(request_id)
            raise
        try:
            await store.save(request_id, meta=_meta(record, prefs), owner=owner, nonce=nonce)
        except StoreUnavailableError as exc:
            # Kafka has it and the marker is there: only a retry of this id would be told it
            # is in flight, until its result comes.
            _log.warning("request %s is accepted, but still marked publishing: %s", request_id, exc)

    async def _call(
        self,
        record: RequestRecord,
        prefs: OutputPrefs,
        wait_s: float,
        owner: str | None,
        lane: Lane = "realtime",
        *,
        chosen: bool = False,
    ) -> ResultRecord:
        """`chosen`: the caller chose the request id, which is then reserved in the result store
        for the call's wait: no other caller, on any replica, takes it meanwhile (409)."""
        request_id = str(record["request_id"])
        nonce = _nonce(record)
        # Refused at once while Kafka is unreachable: waiting could only end in a timeout.
        self._services.publisher.check()
        if chosen:
            await self._services.store.save(
                request_id, owner=owner, nonce=nonce, claim=True, ttl_s=wait_s + _RESERVE_S
            )
        kept = False
        try:
            self._admission.admit(request_id, model=record["model"], wait_s=wait_s, lane=lane)
        except TidegateError:
            await self._release(request_id, nonce, chosen)
            raise
        reply = self._router.expect(request_id, owner, nonce)
        try:
            deadline = CallDeadline(reply, wait_s, request_id)
            deadline.arm(self._services.publisher.send(record, lane, deadline.failed))
            try:
                result = await reply
            finally:
                deadline.cancel()
            if result.get("status") == "DEADLINE_EXCEEDED":
                # A worker's DEADLINE_EXCEEDED that came before Kafka's late ack is answered 504
                # too, which promises a fetch by id: the router stores the result, and this its
                # request, as for a call that timed out here.
                kept = await self._keep_late(request_id, record, prefs, owner, nonce)
            return result
        except ResultTimeoutError:
            # Remembered before anything is awaited, so a result arriving meanwhile is stored.
            self._router.keep(request_id, owner, nonce)
            try:
                await self._services.store.save(
                    request_id, meta=_meta(record, prefs), owner=owner, nonce=nonce
                )
            except RequestIdTakenError:
                # Its result will not be stored either (the store refuses it the same way).
                self._router.drop(request_id)
                raise
            except StoreUnavailableError as exc:
                raise ResultTimeoutError(
                    f"no result for {request_id} within {wait_s}s, and it may not be retrievable "
                    f"later: {exc}"
                ) from None
            kept = True
            raise
        finally:
            self._router.forget(request_id, reply)
            self._admission.release(request_id)
            if not kept:
                await self._release(request_id, nonce, chosen)

    async def _keep_late(
        self,
        request_id: str,
        record: RequestRecord,
        prefs: OutputPrefs,
        owner: str | None,
        nonce: str | None,
    ) -> bool:
        try:
            await self._services.store.save(
                request_id, meta=_meta(record, prefs), owner=owner, nonce=nonce
            )
        except TidegateError as exc:
            _log.warning("the late answer of %s may not be fetched by id: %s", request_id, exc)
            return False
        return True

    async def _release(self, request_id: str, nonce: str | None, chosen: bool) -> None:
        """Give back a chosen id's reservation: the call ended, and promised no later fetch."""
        if not chosen or nonce is None:
            return
        try:
            await self._services.store.release(request_id, nonce)
        except StoreUnavailableError as exc:
            # It expires by itself, a few seconds after the call's wait.
            _log.warning("could not release the id %s: %s", request_id, exc)

    async def lookup(self, request_id: str, caller: Identity) -> Stored:
        """A request by id, as the result store has it; `RequestNotFoundError` if it does not,
        or if `caller` is neither its owner nor an unscoped admin (the same answer: whether
        another caller's request exists is not told)."""
        valid = call_record.is_request_id(request_id)
        stored = await self._services.store.get(request_id) if valid else None
        if stored is None or not _may_fetch(caller, stored.owner):
            raise RequestNotFoundError(f"no request {request_id!r} is known, or it expired")
        prefs = OutputPrefs.from_meta((stored.meta or {}).get("prefs"))
        if stored.result is None:
            return Stored(None, prefs)
        result = await asyncio.to_thread(self._services.decode_result, stored.result)
        return Stored(result, prefs)


def _may_fetch(caller: Identity, owner: str | None) -> bool:
    """Whether `caller` may see a stored request of `owner`. One stored without an owner (before
    owners were recorded) is an unscoped admin's only; `local:insecure` is one."""
    return (owner is not None and caller.subject == owner) or caller.is_admin


def _nonce(record: RequestRecord) -> str | None:
    """The nonce of the submission `record` is (`call_record.new_record` set it)."""
    reply_to = record.get("reply_to")
    return reply_to.get("nonce") if reply_to else None


def _meta(record: RequestRecord, prefs: OutputPrefs, *, publishing: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"model": record["model"], "prefs": prefs.to_meta()}
    if publishing:
        meta[_PUBLISHING] = True
    return meta

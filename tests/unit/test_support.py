"""`wait_for` and its async twin `eventually` never hide a failure: an assertion (or any error
not named as transient) inside a probe fails at once, on the first try; only the named transient
errors and falsy answers are polled again, and a wait that never succeeds says what it waited for
and the last transient error it met."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from tests.support import WaitTimeoutError, eventually, retry_later, wait_for


def polled(kind: str, probe: Callable[[], Any], **options: Any) -> Any:
    """`probe` polled by `wait_for`, or by `eventually` through a coroutine around it."""
    if kind == "sync":
        return wait_for(probe, **options)

    async def coroutine() -> Any:
        return probe()

    return asyncio.run(eventually(coroutine, **options))


KINDS = pytest.mark.parametrize("kind", ["sync", "async"])


class Counted:
    """A probe that answers from `script` in order (an exception is raised), counting calls."""

    def __init__(self, *script: object) -> None:
        self.script = list(script)
        self.calls = 0

    def __call__(self) -> object:
        answer = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        if isinstance(answer, BaseException):
            raise answer
        return answer


@KINDS
def test_a_wrong_answer_inside_a_probe_fails_at_once(kind: str) -> None:
    calls: list[int] = []

    def probe() -> bool:
        calls.append(1)
        answer = {"data": [6, 3, 22, 8]}
        assert answer["data"] == [6, 3, 22, 7], "the deliberately wrong answer"
        return True

    with pytest.raises(AssertionError, match="the deliberately wrong answer") as failed:
        polled(kind, probe, timeout=60, interval=0.001, what="the answer")
    assert not isinstance(failed.value, WaitTimeoutError), "it fails as itself, not as a timeout"
    assert len(calls) == 1


@KINDS
def test_an_error_not_named_transient_propagates_on_the_first_try(kind: str) -> None:
    probe = Counted(KeyError("outputs"), True)
    with pytest.raises(KeyError):
        polled(kind, probe, timeout=60, interval=0.001)
    assert probe.calls == 1


@KINDS
def test_a_named_transient_error_is_retried(kind: str) -> None:
    probe = Counted(ConnectionRefusedError(), TimeoutError(), "up")
    got = polled(kind, probe, timeout=60, interval=0.001, retry_on=(OSError,))
    assert (got, probe.calls) == ("up", 3)


@KINDS
def test_connection_errors_are_the_default_transient_errors(kind: str) -> None:
    probe = Counted(ConnectionResetError(), "up")
    assert polled(kind, probe, timeout=60, interval=0.001) == "up"
    with pytest.raises(TimeoutError):
        polled(kind, Counted(TimeoutError(), "up"), timeout=60, interval=0.001)


@KINDS
def test_falsy_answers_mean_not_yet(kind: str) -> None:
    probe = Counted(None, 0, [], {"done": True})
    assert polled(kind, probe, timeout=60, interval=0.001) == {"done": True}
    assert probe.calls == 4


@KINDS
def test_a_wait_that_never_succeeds_names_what_and_the_last_transient_error(kind: str) -> None:
    probe = Counted(None, ConnectionRefusedError("port 9 refused"))
    expected = r"waiting for the broker; .*port 9 refused"
    with pytest.raises(WaitTimeoutError, match=expected) as failed:
        polled(kind, probe, timeout=0.05, interval=0.001, what="the broker")
    assert isinstance(failed.value, AssertionError)
    assert probe.calls >= 2


@KINDS
@pytest.mark.parametrize("catch_all", [Exception, AssertionError])
def test_retry_on_may_not_name_what_would_catch_an_assertion(
    kind: str, catch_all: type[Exception]
) -> None:
    probe = Counted(True)
    with pytest.raises(TypeError, match="would hide a failure"):
        polled(kind, probe, retry_on=(ConnectionError, catch_all))
    assert probe.calls == 0


class Answer:
    def __init__(self, status_code: int, body: object) -> None:
        self.status_code = status_code
        self.body = body

    def json(self) -> object:
        return self.body


@pytest.mark.parametrize(
    ("answer", "later"),
    [
        (Answer(503, {"code": "UNAVAILABLE", "retriable": True}), True),
        (Answer(503, {"code": "INTERNAL", "retriable": False}), False),
        (Answer(500, {"code": "INTERNAL", "retriable": True}), False),
        (Answer(200, {"outputs": []}), False),
        (Answer(503, ["not", "a", "problem"]), False),
    ],
)
def test_only_a_retriable_503_problem_means_try_later(answer: Answer, later: bool) -> None:
    assert retry_later(answer) is later


def test_eventually_polls_a_plain_probe_while_the_loop_runs_its_tasks() -> None:
    async def scenario() -> list[int]:
        seen: list[int] = []

        async def producer() -> None:
            for i in range(3):
                await asyncio.sleep(0)
                seen.append(i)

        task = asyncio.create_task(producer())
        got = await eventually(lambda: seen if len(seen) == 3 else None, timeout=60, interval=0)
        await task
        return got

    assert asyncio.run(scenario()) == [0, 1, 2]

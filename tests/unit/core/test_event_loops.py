"""The event loop of the worker and the controller: uvloop where installed, by default."""

from __future__ import annotations

import asyncio
import sys

import pytest
import uvloop

from tidegate.core.errors import ConfigurationError
from tidegate.core.event_loops import new_event_loop


def test_auto_and_uvloop_give_uvloop_where_it_is_installed() -> None:
    for kind in ("auto", "uvloop"):
        loop = new_event_loop(kind)
        try:
            assert isinstance(loop, uvloop.Loop), kind
            assert loop.run_until_complete(asyncio.sleep(0, "ran")) == "ran"
        finally:
            loop.close()


def test_asyncio_gives_the_standard_librarys_loop() -> None:
    loop = new_event_loop("asyncio")
    try:
        assert not isinstance(loop, uvloop.Loop)
        assert isinstance(loop, asyncio.BaseEventLoop)
    finally:
        loop.close()


def test_without_uvloop_auto_falls_back_and_uvloop_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # what an import finds on Windows
    loop = new_event_loop("auto")
    try:
        assert not isinstance(loop, uvloop.Loop)
    finally:
        loop.close()
    with pytest.raises(ConfigurationError, match="uvloop, which is not installed"):
        new_event_loop("uvloop")

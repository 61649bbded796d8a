"""uvicorn's private httptools protocol, which web/sockets.py subclasses: its shape is checked, and a changed shape
stops the server from starting rather than letting it serve without read deadlines."""

from __future__ import annotations

import asyncio
import tomllib

import pytest
import uvicorn
from uvicorn.protocols.http import httptools_impl

from tests.conftest import ROOT
from textbook_chat.web import protocol_shape
from textbook_chat.web.sockets import SocketGuard


class _Refactored:
    """What a later uvicorn might ship: the head callback renamed, the cycle kept under another name."""

    def __init__(self, config: object, server_state: object, app_state: object, _loop: object = None) -> None:
        self.loop, self.server_state, self.transport, self.client = _loop, server_state, None, None
        self.current_cycle = None

    def connection_made(self, transport: object) -> None: ...
    def connection_lost(self, exc: object) -> None: ...
    def data_received(self, data: bytes, *, flush: bool = False) -> None: ...
    def on_message_begin(self) -> None: ...
    def on_headers_done(self) -> None: ...
    def on_message_complete(self) -> None: ...
    def send_400_response(self, msg: str) -> None: ...


def test_the_installed_uvicorn_has_every_method_and_attribute_sockets_relies_on() -> None:
    assert protocol_shape.shape_errors() == []


def test_the_installed_uvicorn_is_within_the_range_pyproject_pins() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (pin,) = [d for d in project["dependencies"] if d.startswith("uvicorn")]
    assert pin == "uvicorn[standard]>=0.54,<0.55"  # an upper bound: the next minor is checked before it is allowed
    assert uvicorn.__version__.startswith("0.54.")
    assert protocol_shape.TESTED == "uvicorn 0.54"


def test_a_refactored_protocol_is_described_method_by_method() -> None:
    errors = protocol_shape.shape_errors(protocol=_Refactored)
    assert errors == [
        "_Refactored.data_received('self', 'data', 'flush') was data_received('self', 'data')",
        "_Refactored.on_headers_complete() is gone",
        "_Refactored no longer sets self.cycle",
    ]


def test_the_server_does_not_start_on_a_uvicorn_whose_protocol_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(httptools_impl.HttpToolsProtocol, "on_headers_complete")
    with pytest.raises(RuntimeError, match=r"on_headers_complete\(\) is gone.*does not start"):
        SocketGuard().protocol()  # what `serve` hands uvicorn as http=


def test_on_the_installed_uvicorn_the_guard_builds_its_protocol() -> None:
    loop = asyncio.new_event_loop()
    try:
        config = uvicorn.Config(app=lambda *_: None)
        made = SocketGuard().protocol()(config, uvicorn.server.ServerState(), {}, loop)
        assert isinstance(made, httptools_impl.HttpToolsProtocol)
    finally:
        loop.close()

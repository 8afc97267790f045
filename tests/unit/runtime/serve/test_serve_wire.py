"""How `conductor serve` reads a chat request's body (runtime/serve/wire.py, app.py
`parse_chat`): the bound on the objects it builds, and the errors a client reads."""

from __future__ import annotations

import json
from typing import Any

import pytest

from conductor_engine.runtime.serve.app import ApiError, parse_chat
from conductor_engine.runtime.serve.wire import (
    MAX_REQUEST_OBJECTS,
    TooManyObjects,
    read_chat_request,
)


def _body(messages: list[dict[str, Any]], **extra: Any) -> bytes:
    return json.dumps({"model": "conductor", "messages": messages, **extra}).encode()


def _refused(body: bytes, status: int) -> str:
    with pytest.raises(ApiError) as refused:
        parse_chat(body)
    assert refused.value.status == status
    return str(refused.value)


def test_a_request_may_hold_the_bound_of_objects_and_not_one_more() -> None:
    at_bound = [{"role": "user", "content": "hi"}] * MAX_REQUEST_OBJECTS
    assert len(read_chat_request(_body(at_bound)).messages) == MAX_REQUEST_OBJECTS
    with pytest.raises(TooManyObjects):
        read_chat_request(_body([*at_bound, {"role": "user", "content": "hi"}]))
    parts = [{"type": "text", "text": "a"}] * MAX_REQUEST_OBJECTS  # and the message holding them
    with pytest.raises(TooManyObjects):
        read_chat_request(_body([{"role": "user", "content": parts}]))
    line = _refused(_body([{"role": "user", "content": parts}]), 413)
    assert line == ("the request holds over 10,000 messages and content parts, more than any "
                    "conversation the conductor takes: send fewer")


def test_objects_in_fields_the_server_ignores_do_not_count() -> None:
    tools = [{"type": "function", "function": {"name": f"f{i}"}} for i in range(6000)]
    chat = read_chat_request(_body([{"role": "user", "content": "hi"}], tools=tools))
    assert chat.messages[0].text == "hi"


def test_content_is_text_a_list_of_text_parts_or_none() -> None:
    chat = read_chat_request(_body([
        {"role": "system", "content": None},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "user", "content": "x" * 5000}]))
    assert [m.text for m in chat.messages] == ["", "a\nb", "x" * 5000]
    image = _refused(_body([{"role": "user", "content": [{"type": "image_url"}]}]), 400)
    assert "the conductor reads text only; this message has image_url parts" in image
    assert "Value error" not in image
    assert _refused(_body([{"role": "user", "content": 7}]), 400).startswith(
        "messages.0.content")

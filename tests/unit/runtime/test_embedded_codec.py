"""The embedded codec endpoint (runtime/embedded.py `start_codec`): when it cannot start, the
error says how it ended and what its log said, not only where the log is."""

from __future__ import annotations

from pathlib import Path

import pytest

from conductor_engine.runtime.embedded import EmbeddedError, EmbeddedTemporal
from tests.conftest import free_port


def test_a_codec_endpoint_that_exits_at_start_is_reported_with_its_code_and_its_last_words(
        tmp_path: Path) -> None:
    missing = tmp_path / "no-such-key"
    server = EmbeddedTemporal(tmp_path / "data", codec_key=missing, codec_port=free_port())
    with pytest.raises(EmbeddedError) as refused:
        server.start_codec(detached=False)
    message = str(refused.value)
    assert "the codec endpoint exited with code 1" in message
    assert f"the payload key {missing} does not exist" in message, "its log's last line"
    assert "CONDUCTOR_EMBEDDED_CODEC_PORT" in message
    assert server.codec_process is None

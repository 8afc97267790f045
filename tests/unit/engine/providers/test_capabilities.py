"""Each provider declares what it can do; reading a declaration imports no SDK; every provider
module is a `Provider` (engine/providers/protocol.py), at runtime and for the type checker."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from typing import get_args

from conductor_engine.engine.providers import Capabilities, capabilities, protocol
from conductor_engine.engine.providers.protocol import Provider, provider_module
from conductor_engine.engine.providers.registry import MODULES, ProviderName, web_search_providers


def test_every_provider_declares_its_capabilities() -> None:
    for name in get_args(ProviderName):
        assert isinstance(capabilities(name), Capabilities), name


def test_every_provider_module_is_a_provider_the_type_checker_checks() -> None:
    """Each module the registry names has the protocol's members, and is one of the modules
    protocol.py assigns to a `Provider` under TYPE_CHECKING, where mypy checks their types (a
    provider added to MODULES alone would otherwise be called unchecked)."""
    for name in get_args(ProviderName):
        assert isinstance(provider_module(name), Provider), name
    checked = {node.value.id for node in ast.walk(ast.parse(inspect.getsource(protocol)))
               if isinstance(node, ast.AnnAssign) and isinstance(node.annotation, ast.Name)
               and node.annotation.id == "Provider" and isinstance(node.value, ast.Name)}
    named = {module.rsplit(".", 1)[1] for module in MODULES.values()}
    assert named == checked, f"provider modules mypy does not check: {sorted(named - checked)}"


def test_the_declarations() -> None:
    json_mode = {n for n in get_args(ProviderName) if capabilities(n).structured_output}
    assert json_mode == {"openai", "openai-compatible", "google", "local"}
    assert web_search_providers() == ["openai", "anthropic", "google"]
    assert capabilities("openai").web_search_options == {
        "max_uses", "allowed_domains", "user_location"}
    assert capabilities("anthropic").web_search_options == {
        "max_uses", "allowed_domains", "blocked_domains", "user_location"}
    assert capabilities("google").web_search_options == frozenset()
    trained = {n: capabilities(n).trained_versions for n in get_args(ProviderName)
               if capabilities(n).trained_versions}
    assert trained == {"local": "checkpoint", "openai-compatible": "served"}


def test_reading_the_declarations_imports_no_sdk_and_preload_does() -> None:
    code = (
        "import sys\n"
        "from typing import get_args\n"
        "from conductor_engine.engine.providers import capabilities, preload\n"
        "from conductor_engine.engine.contracts.agents import AgentSpec, ProviderName\n"
        "sdks = ('openai', 'anthropic', 'google.genai')\n"
        "for name in get_args(ProviderName):\n"
        "    capabilities(name)\n"
        "assert not [m for m in sdks if m in sys.modules], [m for m in sdks if m in sys.modules]\n"
        "preload([AgentSpec(id=p, provider=p, model='m') for p in ('openai', 'anthropic', "
        "'google')])\n"
        "assert all(m in sys.modules for m in sdks)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr

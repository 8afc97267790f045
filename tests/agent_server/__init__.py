"""One scripted agent server for tests and benchmarks, speaking all three wire formats.

A real local HTTP server (stdlib, in a daemon thread) so the providers are tested through the
real SDKs, over real sockets: URL building, headers, timeouts, error classes and body parsing
are the SDKs' own. The three API families differ only in how a request is decoded and a reply
encoded; scripting, counting and recording are shared.

    with start_agent_server() as server:
        server.script("gpt-x", [Reply.error(429, retry_after=1), Reply.ok("42")])
        spec = server.spec("openai", "gpt-x", api_key_env="OPENAI_API_KEY")
        ...
        assert server.calls("gpt-x") == 2

Routes (what the SDKs request when given the base URLs below), and the module of each codec:
    OpenAI     POST /v1/chat/completions             base_url = server.openai_base_url (".../v1")
               POST /v1/responses                    (the Responses API: calls with web search)
                                                     openai.py
    Anthropic  POST /v1/messages                     base_url = server.anthropic_base_url
                                                     anthropic.py
    Gemini     POST /{v1,v1beta}/models/{m}:generateContent
                                                     base_url = server.gemini_base_url
                                                     google.py
(google-genai 3.x calls /v1/...; older releases called /v1beta/...; both are served.)
    vLLM LoRA  POST /v1/load_lora_adapter, /v1/unload_lora_adapter   vllm.py

vLLM played by the local model (local_vllm.py, `LocalVllm`): not scripted but sampled, with the
local provider's sampler and plan grammar behind vLLM's wire (structured outputs, token ids,
runtime LoRA), so a conductor can train "behind the wire" (bench_learning.py --via-api).

The rest: reply.py (`Reply`, what a test scripts), codec.py (`AgentRequest`, a request decoded
alike whatever its family, and what the codecs share), wire.py (the HTTP side: paths to codecs,
API keys, sending, hang-ups), server.py (`AgentServer`: scripts, recorded requests, delays, start
and stop; `start_agent_server`; the `agent_server` fixture).

Runtime LoRA, as vLLM started with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True
answers it (vllm.py has the details). `vllm_lora(runtime_updating=False)` makes the routes 404
"Not Found", as a server without runtime updating does; `drop_adapters()` forgets every adapter,
as a restarted vLLM does; `lora_calls()` records them.

Web search: a reply scripted with `citations` carries them in the family's own wire format (URL
citation annotations, `web_search_result_location` citations after a search's tool blocks,
`groundingMetadata`), but only when the request asked for the provider's web search tool, as a
real provider would; `AgentRequest.web_search` says whether it did.

A delayed reply notices the client hanging up (its timeout, or a cancelled call) and stops
waiting; `AgentRequest.hung_up` records that, so tests can see a call was really abandoned.
"""

from tests.agent_server.reply import Reply
from tests.agent_server.server import AgentServer, agent_server, start_agent_server

__all__ = ["AgentServer", "Reply", "agent_server", "start_agent_server"]

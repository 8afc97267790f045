"""Training through the API path end to end: the conductor served behind the OpenAI-compatible
wire (tests/agent_server/local_vllm.py plays vLLM with the local model), on the real Temporal dev
server and PostgreSQL. Plans come back as token ids under `structured_outputs`; the trainer
reconstructs the grammar's records from them (forced tokens, choice sets), recomputes the behaviour
log-probs; each published version is loaded through vLLM's runtime LoRA route and serves the
next iteration's rollouts (issue 33, item 4)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from temporalio.client import Client

from conductor_engine.engine.contracts.names import training_workflow_id
from conductor_engine.engine.contracts.traces import PolicyRef
from conductor_engine.engine.contracts.training import (
    LossConfig,
    PolicyConfig,
    Recipe,
    RolloutConfig,
)
from conductor_engine.engine.contracts.training_runs import TrainInput, TrainProgress
from conductor_engine.engine.settings import Settings
from conductor_engine.engine.storage.policies import PolicyRegistry, served_name
from conductor_engine.engine.storage.trace_store import TraceStore
from tests.agent_server.local_vllm import LocalVllm
from tests.integration.test_training import (
    generated_pool,
    trainer_settings,
    training_stack,
    wait_for,
)
from tests.rollout_groups import read_groups


@pytest.mark.slow
async def test_a_conductor_served_behind_the_openai_wire_trains_on_reconstructed_records(
    client: Client, settings: Settings, tiny_policy_dir: Path, tmp_path: Path,
    trace_store: TraceStore,
) -> None:
    """Two iterations of a one-layer conductor (tests/tiny_policy.py) served by vLLM's wire:
    every rollout's plan arrives as served ids without records, none is rejected by the grammar,
    the samples the trainer builds from them carry forced tokens and choice sets, and version 1,
    published as a LoRA adapter, is loaded by its route and samples iteration 2."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from conductor_engine.engine.providers.local.reconstruct import Vocabulary
    from conductor_engine.trainer.reconstruct import needs_reconstruction, reconstruct_trace
    from conductor_engine.trainer.rollouts import attempt_sample, deciding_attempts

    settings = trainer_settings(settings)
    pool, tasks, _ = generated_pool(str(tiny_policy_dir), tmp_path, seed=0, tasks_per_tag=1)
    with LocalVllm(str(tiny_policy_dir)) as server:
        conductor_spec = pool.conductor.model_copy(update={
            "provider": "openai-compatible", "base_url": server.openai_base_url})
        pool = pool.model_copy(update={"conductor": conductor_spec})
        name = pool.conductor.id
        recipe = Recipe(
            policy=PolicyConfig(base=str(tiny_policy_dir), lora=True, lora_r=8),
            loss=LossConfig(learning_rate=1e-3, micro_batch_size=16),
            rollouts=RolloutConfig(group_size=4, groups_per_update=4, max_staleness=0),
        )
        inp = TrainInput(name=f"api-{uuid.uuid4().hex[:6]}", policy=name, tasks=tasks,
                         iterations=2, recipe=recipe,
                         trainer_task_queue=settings.trainer_task_queue)
        async with training_stack(client, settings, pool) as conductor:
            await conductor.start_training(inp)
            handle = client.get_workflow_handle(training_workflow_id(inp.name),
                                                result_type=TrainProgress)
            await wait_for(handle, lambda p: len(p.history) >= 2,
                           timeout=20 * 60)  # a safety net for a hung run only
            final: TrainProgress = await handle.result()
        served = server.served()
        loads = server.lora_calls()

    # what the trainer built from the base version's rollouts: reconstructed records in every sample
    tokenizer = AutoTokenizer.from_pretrained(tiny_policy_dir)
    vocab = Vocabulary.of(AutoModelForCausalLM.from_pretrained(tiny_policy_dir), tokenizer)
    groups = await read_groups(trace_store, PolicyRef(name=name, version="base"), size=4,
                               limit=100)
    traces = [t for g in groups for t in g.traces]
    assert len(traces) == 16
    for trace in traces:
        attempt = deciding_attempts(trace)[-1]
        assert needs_reconstruction(attempt), "a served plan carries ids and its schema, no records"
        rebuilt = reconstruct_trace(trace, vocab)
        assert not isinstance(rebuilt, str), rebuilt
        sample = attempt_sample(deciding_attempts(rebuilt)[-1], tokenizer, 1.0)
        assert sample is not None and sample.forced is not None and any(sample.forced)
        assert sample.choices, f"no choice set in {attempt.raw_text!r}"
        assert sample.behaviour_logprobs is None  # recomputed by the trainer, not the server's

    assert [s.published for s in final.history] == ["v1", "v2"], final
    for step in final.history:
        assert step.rollouts == 16 and step.trained_tokens > 0, step
        assert "grammar_rejected" not in step.update_left_out, step.update_left_out
        assert "grammar_rejected" not in step.left_out, step.left_out

    # vLLM's route loaded version 1 from the registry's adapter, and it sampled iteration 2
    v1 = served_name(name, 1)
    assert [(c.route, c.lora_name, c.status) for c in loads][:1] == [("load", v1, 200)], loads
    version = await PolicyRegistry(trace_store.pool).get(name, 1)
    assert version.kind == "lora" and "adapter_config.json" in version.files
    assert Path(loads[0].lora_path or "").is_dir()
    assert sum(s.model == v1 and s.checkpoint == loads[0].lora_path for s in served) == 16
    assert all(s.constrained and s.seed is not None for s in served)


async def test_the_wire_server_refuses_what_it_would_sample_under_another_grammar() -> None:
    """A schema sent as `response_format`, or as structured outputs with free whitespace, is
    refused (400) rather than sampled under the local provider's compact grammar, which the
    trainer's reconstruction would then reject; a model name it does not hold is vLLM's 404."""
    import httpx

    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    base = {"model": "base-model", "messages": [{"role": "user", "content": "hi"}]}
    with LocalVllm("base-model") as server:
        async with httpx.AsyncClient(base_url=server.openai_base_url) as http:
            loose = await http.post("/chat/completions", json={
                **base, "structured_outputs": {"json": schema}})
            other = await http.post("/chat/completions", json={
                **base, "response_format": {"type": "json_schema",
                                            "json_schema": {"name": "x", "schema": schema}}})
            unknown = await http.post("/chat/completions", json={**base, "model": "c-v3"})
            lora = await http.post("/load_lora_adapter", json={"lora_name": "c-v3",
                                                                "lora_path": "/nowhere"})
        assert server.served() == []
    assert loose.status_code == 400 and "disable_any_whitespace" in loose.text
    assert other.status_code == 400 and "structured_outputs.json" in other.text
    assert unknown.status_code == 404 and "The model `c-v3` does not exist." in unknown.text
    assert lora.status_code == 404 and "No adapter found for /nowhere" in lora.text

"""What a user or a file sets refuses a misspelt name, and a change to a model goes through
its checks (engine/contracts/strict.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from conductor_engine.engine.contracts.records import PlanAttempt, RoundRecord
from conductor_engine.engine.contracts.strict import revised
from conductor_engine.engine.contracts.tasks import RolloutSampling, RunOptions, Task
from conductor_engine.engine.contracts.training import Recipe
from conductor_engine.engine.settings import Settings, SettingsError
from conductor_engine.engine.tasks.files import load_jsonl
from tests.cli import run_conductor
from tests.paths import ROOT

NOT_SOURCE = {"tests", "site", "build", "dist"}

def _message(error: pytest.ExceptionInfo[ValidationError]) -> str:
    [only] = error.value.errors()
    assert "\n" not in only["msg"], only["msg"]
    return only["msg"]


def test_a_misspelt_run_option_is_refused_in_one_line_with_the_name_it_meant() -> None:
    with pytest.raises(ValidationError) as e:
        RunOptions(max_step=3)  # type: ignore[call-arg]
    assert _message(e).endswith("unknown RunOptions field 'max_step'; did you mean 'max_steps'?")


def test_what_the_engine_sets_is_no_run_option_and_the_refusal_says_where_it_lives() -> None:
    with pytest.raises(ValidationError) as e:
        RunOptions(sampel=3)  # type: ignore[call-arg]
    assert _message(e).endswith(
        "unknown RunOptions field 'sampel'; if you meant 'sample': the engine sets it on a "
        "training run's tasks (Task.sampling.sample)")
    for name in ("sample", "seeded", "explore", "explore_importance"):
        with pytest.raises(ValidationError) as e:
            RunOptions.model_validate({name: 1})
        assert f"(Task.sampling.{name})" in _message(e)
    with pytest.raises(ValidationError, match="unknown SelfCallFrame field 'dpeth'"):
        Task.model_validate({"question": "q", "frame": {"dpeth": 1}})
    with pytest.raises(ValidationError, match="unknown RolloutSampling field 'sampel'"):
        Task.model_validate({"question": "q", "sampling": {"sampel": 1}})


def test_unknown_names_are_refused_on_tasks_and_every_recipe_section() -> None:
    with pytest.raises(ValidationError, match="unknown Task field 'refrence'"):
        Task.model_validate({"question": "q", "refrence": "4"})
    for section, key in [("policy", "lora_rank"), ("loss", "lerning_rate"),
                         ("rollouts", "group_sise"), ("heldout", "fractoin"),
                         ("checkpoints", "keep_checkpoint")]:
        with pytest.raises(ValidationError, match=f"field '{key}'; did you mean"):
            Recipe.model_validate({section: {key: 1}})
    with pytest.raises(ValidationError, match="unknown Recipe field 'polcy'"):
        Recipe.model_validate({"polcy": {}})


def test_trl_names_stay_accepted_where_unknown_names_are_refused() -> None:
    r = Recipe.model_validate({"num_generations": 4, "loss": {"epsilon": 0.1,
                                                              "num_iterations": 2}})
    assert (r.rollouts.group_size, r.loss.epsilon_low, r.loss.epsilon_high,
            r.loss.steps_per_update) == (4, 0.1, 0.1, 2)


def test_a_misspelt_setting_given_in_code_is_one_line_naming_the_setting_meant() -> None:
    with pytest.raises(SettingsError) as e:
        Settings(tempral_address="localhost:7233")  # type: ignore[call-arg]
    assert str(e.value) == "tempral_address: unknown setting; did you mean 'temporal_address'?"


def test_a_misspelt_option_in_a_task_file_is_a_line_error_naming_the_option_meant(
        tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps({"id": "a", "question": "q", "options": {"max_step": 2}}) + "\n")
    loaded = load_jsonl(path)
    assert not loaded.tasks
    [line] = loaded.error_lines()
    assert "\n" not in line and "unknown RunOptions field 'max_step'; did you mean " \
        "'max_steps'?" in line, line
    proc = run_conductor("tasks", "check", str(path))
    assert proc.returncode == 1 and "did you mean 'max_steps'?" in proc.stderr, proc.stderr


def test_an_engine_field_in_a_task_files_options_is_one_line_saying_where_it_lives(
        tmp_path: Path) -> None:
    """A task file cannot make its runs look like training rollouts: `sample` is refused."""
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps({"id": "a", "question": "q", "options": {"sampel": 3}}) + "\n")
    proc = run_conductor("tasks", "check", str(path))
    [line] = [ln for ln in proc.stderr.splitlines() if "field options" in ln]
    assert proc.returncode == 1 and line.startswith(f"{path}:1: field options:"), proc.stderr
    assert line.endswith("unknown RunOptions field 'sampel'; if you meant 'sample': the engine "
                         "sets it on a training run's tasks (Task.sampling.sample)"), line


def test_a_misspelt_recipe_key_stops_the_command_with_one_line(tmp_path: Path) -> None:
    recipe = tmp_path / "recipe.toml"
    recipe.write_text("[loss]\nlerning_rate = 1e-5\n")
    env = {"CONDUCTOR_POOL_FILE": str(ROOT / "examples/sim/pool.toml"),
           "CONDUCTOR_DATA_DIR": str(tmp_path / "data")}
    proc = run_conductor("train", "start", str(ROOT / "examples/sim/tasks.jsonl"), "--recipe",
                         str(recipe), env=env)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr
    assert "field loss" in lines[0] and "did you mean 'learning_rate'?" in lines[0], lines[0]


def test_revised_validates_what_model_copy_would_let_through() -> None:
    options = RunOptions()
    with pytest.raises(TypeError, match="RunOptions has no field 'sampel'"):
        revised(options, sampel=3)
    with pytest.raises(ValidationError, match="max_steps"):
        revised(options, max_steps=-5)
    with pytest.raises(ValidationError, match="sample"):
        revised(RolloutSampling(), sample=-5)
    task = Task(question="Which is larger?", reference="2; 3", parts=["a", "b"])
    with pytest.raises(ValidationError, match="parts names 2 parts but the answer has 1"):
        revised(task, reference="2")  # the model's own validators run on the result


def test_revised_keeps_the_rest_the_class_and_the_fields_set() -> None:
    class Mine(RunOptions):
        note: str = ""

    mine = Mine(max_steps=3)
    changed = revised(mine, temperature=0.5)
    assert type(changed) is Mine and (changed.max_steps, changed.temperature) == (3, 0.5)
    assert changed.model_fields_set == {"max_steps", "temperature"}
    task = Task(question="q")  # its id is a default: it must not be drawn again
    assert revised(task, batch="b").id == task.id


def test_revised_passes_nested_models_as_they_are() -> None:
    """Why it is cheap: no nested model is rebuilt."""
    attempt = PlanAttempt(attempt=1, raw_text="{}")
    rnd = RoundRecord(index=0, attempts=[attempt])
    assert revised(rnd, index=1).attempts[0] is attempt


def test_no_source_file_changes_a_model_with_model_copy_update() -> None:
    """`model_copy(update=...)` skips validation: a misspelt name becomes a stray attribute and
    a refused value goes through. `revised` is the checked copy."""
    tops = [t for t in ROOT.iterdir() if not t.name.startswith(".") and t.name not in NOT_SOURCE]
    files = [p for t in tops for p in ([t] if t.is_file() else t.rglob("*.py"))
             if p.suffix == ".py"]
    found = {str(p.relative_to(ROOT)) for p in files
             if re.search(r"model_copy\(\s*update\s*=", p.read_text(encoding="utf-8"))}
    assert not found, (f"{sorted(found)}: model_copy(update=...) skips validation; "
                       "use engine.contracts.strict.revised(model, field=value)")

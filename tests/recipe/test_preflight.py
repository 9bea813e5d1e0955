"""Pre-launch checks: each mistake that used to pass validate and fail after Ray started now exits 2 in validate.

One test per row of the "validate passes, train fails" table, through the CLI (validate, and train where
the check must stop the run before Ray starts), plus the run-time side of the shared code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlhfctl.cli import app
from rlhfctl.recipe import preflight as preflight_module
from tests.recipe.builders import recipe_data, write_recipe

REPO = Path(__file__).resolve().parents[2]

REWARDS = '''
def positional(prompt, response):
    return [0.0 for _ in response]

def trl_style(completions, **kwargs):
    return [0.0 for _ in completions]

def needs_answer(prompts, responses, answer, **columns):
    return [float(r == a) for r, a in zip(responses, answer)]

def no_kwargs(prompts, responses):
    return [0.0 for _ in responses]

def reverse_score(prompts, responses, **columns):
    return [0.0 for _ in responses]

def agent_score(prompts, responses, ground_truth, messages, tool_rewards):
    return [float(r) for r in tool_rewards]
'''


@pytest.fixture
def runner():
    from typer.testing import CliRunner

    return CliRunner()


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory holding rewards.py and a good data file (data.jsonl: prompt, ground_truth)."""
    (tmp_path / "rewards.py").write_text(REWARDS)
    (tmp_path / "data.jsonl").write_text("".join(
        json.dumps({"prompt": f"q{i}", "ground_truth": str(i)}) + "\n" for i in range(20)))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("rewards", None)
    return tmp_path


def _recipe(folder: Path, function: str = "rewards.py:reverse_score", data: str = "data.jsonl") -> Path:
    recipe = recipe_data(data={"train_files": [str(folder / data)]})
    recipe["roles"]["reward"]["function"] = function
    return write_recipe(folder, recipe)


def _invoke(runner, *args: str):
    result = runner.invoke(app, list(args))
    assert "Traceback" not in result.output, result.output
    return result


def _fails(runner, command: str, recipe: Path, *overrides: str):
    result = _invoke(runner, command, str(recipe), *overrides)
    assert result.exit_code == 2, result.output
    return result.stderr


def test_a_good_custom_recipe_passes(runner, workdir):
    result = _invoke(runner, "validate", str(_recipe(workdir)))
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("command", ["validate", "train"])
@pytest.mark.parametrize("function, needs", [
    ("rewards.py:positional", "'prompt', 'response'"),    # score(prompt, response)
    ("rewards.py:trl_style", "'completions'"),             # TRL-style (completions, **kwargs)
])
def test_a_reward_function_with_the_wrong_signature(runner, workdir, command, function, needs):
    stderr = _fails(runner, command, _recipe(workdir, function))
    assert "roles.reward.function" in stderr and f"it needs {needs}" in stderr
    assert "fn(prompts=[...], responses=[...], **columns)" in stderr


def test_a_reward_function_naming_the_agent_rollouts_columns_passes_only_with_an_agent_rollout(runner, workdir):
    recipe = _recipe(workdir, "rewards.py:agent_score")
    stderr = _fails(runner, "validate", recipe)
    assert "it needs 'messages', 'tool_rewards'" in stderr
    result = _invoke(runner, "validate", str(recipe), "rollout.multi_turn.enable=true",
                     "rollout.multi_turn.tools=[{class: rlhfctl.agents.tools.calculator:Calculator}]",
                     "rollout.multi_turn.max_response_tokens=64")
    assert result.exit_code == 0 and "roles.reward.function" not in result.output, result.output


def test_a_reward_function_needing_a_column_the_data_lacks(runner, workdir):
    stderr = _fails(runner, "validate", _recipe(workdir, "rewards.py:needs_answer"))
    assert "roles.reward.function" in stderr and "it needs 'answer'" in stderr
    assert "data columns: ground_truth" in stderr and "data.train_files" in stderr


def test_a_reward_function_without_kwargs_must_take_every_column(runner, workdir):
    stderr = _fails(runner, "validate", _recipe(workdir, "rewards.py:no_kwargs"))
    assert "it does not take 'ground_truth'" in stderr and "**columns" in stderr


def test_the_task_columns_are_checked_too(runner, workdir):
    recipe = recipe_data()
    recipe["roles"]["reward"]["function"] = "rewards.py:needs_answer"
    stderr = _fails(runner, "validate", write_recipe(workdir, recipe))
    assert "it needs 'answer'" in stderr and "ground_truth" in stderr and "data.task" in stderr


@pytest.mark.parametrize("command", ["validate", "train"])
def test_a_data_file_without_the_prompt_column(runner, workdir, command):
    (workdir / "bad.jsonl").write_text('{"question": "q", "ground_truth": "1"}\n')
    stderr = _fails(runner, command, _recipe(workdir, data="bad.jsonl"))
    assert "data.train_files[0]" in stderr and "record 1 has no 'prompt' column (it has: question, ground_truth)" in stderr


@pytest.mark.parametrize("command", ["validate", "train"])
def test_a_malformed_json_line(runner, workdir, command):
    (workdir / "bad.jsonl").write_text('{"prompt": "a"}\n{"prompt": "b"\n')
    stderr = _fails(runner, command, _recipe(workdir, data="bad.jsonl"))
    assert "data.train_files[0]" in stderr and "bad.jsonl: line 2: malformed JSON" in stderr


def test_only_a_bounded_sample_is_read(runner, workdir):
    lines = [json.dumps({"prompt": f"q{i}"}) for i in range(preflight_module.SAMPLE_RECORDS)]
    (workdir / "late.jsonl").write_text("\n".join([*lines, "{not json"]) + "\n")
    assert _invoke(runner, "validate", str(_recipe(workdir, data="late.jsonl"))).exit_code == 0


@pytest.mark.parametrize("command", ["validate", "train"])
def test_the_dot_form_of_a_reward_function_is_rejected_with_the_colon_form(runner, workdir, command):
    stderr = _fails(runner, command, _recipe(workdir, "rewards.reverse_score"))
    assert "roles.reward.function" in stderr and "did you mean 'rewards:reverse_score'?" in stderr


def test_the_run_time_loader_gives_the_same_answer_for_the_dot_form(workdir):
    from rlhfctl.rewards.functions import RewardFunctionError, load_reward_function

    with pytest.raises(RewardFunctionError, match="did you mean 'rewards:reverse_score'"):
        load_reward_function("rewards.reverse_score")
    assert load_reward_function("rewards:reverse_score")([], [], ) == []


@pytest.mark.parametrize("command", ["validate", "train"])
def test_pools_that_do_not_fit_this_machine(runner, workdir, monkeypatch, command):
    monkeypatch.setattr(preflight_module, "_machine_cpus", lambda: 2)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    stderr = _fails(runner, command, _recipe(workdir), "resource_pools.main.process_on_nodes=[8]")
    assert "resource_pools.main.process_on_nodes" in stderr and "reserve 4 CPUs" in stderr and "has 2" in stderr


def test_pools_are_checked_against_ray_num_cpus_not_the_machine(runner, workdir, monkeypatch):
    monkeypatch.setattr(preflight_module, "_machine_cpus", lambda: 2)
    result = _invoke(runner, "validate", str(_recipe(workdir)), "resource_pools.main.process_on_nodes=[8]",
                     "ray.num_cpus=8")
    assert result.exit_code == 0, result.output


def test_pools_are_not_checked_against_this_machine_when_joining_a_cluster(runner, workdir, monkeypatch):
    monkeypatch.setattr(preflight_module, "_machine_cpus", lambda: 2)
    result = _invoke(runner, "validate", str(_recipe(workdir)), "resource_pools.main.process_on_nodes=[8]",
                     "ray.address=ray://head:10001")
    assert result.exit_code == 0, result.output
    assert "ray.address: joining a cluster, so the pools are not checked against this machine" in result.stdout


@pytest.mark.parametrize("command", ["validate", "train"])
def test_a_typo_in_an_inline_model_config(runner, workdir, command):
    stderr = _fails(runner, command, _recipe(workdir), "roles.actor.model.config.hidden_sise=64")
    assert "roles.actor.model.config.hidden_sise" in stderr and "Qwen2Config has no field 'hidden_sise'" in stderr
    assert "did you mean 'hidden_size'?" in stderr


def test_config_keys_the_model_reads_or_the_class_consumes_are_known(runner, workdir):
    result = _invoke(runner, "validate", str(_recipe(workdir)), "roles.actor.model.config.head_dim=16",
                     "roles.actor.model.config.rope_theta=10000.0")
    assert result.exit_code == 0, result.output


def test_build_config_rejects_the_same_typo_at_run_time():
    from rlhfctl.models.loading import ModelConfigError, build_config
    from rlhfctl.models.tokenizer import CharTokenizer

    model = {"config": {"model_type": "qwen2", "hidden_sise": 64, "num_hidden_layers": 1}}
    with pytest.raises(ModelConfigError, match="model.config.hidden_sise: .*did you mean 'hidden_size'"):
        build_config(model, CharTokenizer())


@pytest.fixture
def no_hub(monkeypatch, tmp_path):
    """An empty Hugging Face cache and an unreachable hub."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(preflight_module, "_hub_reachable", lambda endpoint: False)
    return tmp_path / "hf-cache"


@pytest.mark.parametrize("command", ["validate", "train"])
def test_a_model_path_that_is_neither_local_nor_cached_with_no_hub(runner, workdir, no_hub, command):
    stderr = _fails(runner, command, _recipe(workdir), "roles.actor.model.path=my-org/not-a-model")
    assert "roles.actor.model.path" in stderr and "'my-org/not-a-model' is not a local directory" in stderr
    assert "cannot be reached" in stderr and [line[:6] for line in stderr.splitlines()].count("error:") == 1


def test_a_model_in_the_local_cache_passes_without_the_hub(runner, workdir, no_hub):
    (no_hub / "models--my-org--cached-model" / "snapshots" / "abc123").mkdir(parents=True)
    result = _invoke(runner, "validate", str(_recipe(workdir)), "roles.actor.model.path=my-org/cached-model")
    assert result.exit_code == 0, result.output


def test_the_hub_probe_is_bounded():
    started = time.monotonic()
    assert preflight_module._hub_reachable.__wrapped__("https://unreachable.invalid") is False
    assert time.monotonic() - started < preflight_module._HUB_PROBE_S + 1


@pytest.mark.slow
def test_validate_fails_fast_on_an_offline_hub_in_a_real_process(workdir):
    recipe = _recipe(workdir)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(workdir / "empty-cache"),
           "PYTHONPATH": os.pathsep.join([str(REPO), str(workdir)])}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "rlhfctl.cli", "validate", str(recipe),
                           "roles.actor.model.path=my-org/not-a-model"],
                          capture_output=True, text=True, env=env, cwd=workdir, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "roles.actor.model.path" in done.stderr and "HF_HUB_OFFLINE is set" in done.stderr
    assert time.monotonic() - started < 60


def test_a_model_that_cannot_load_at_run_time_is_a_one_line_user_error(monkeypatch):
    from rlhfctl.cli.errors import EXIT_USER, exit_code_for
    from rlhfctl.models import loading

    def unreachable(*args, **kwargs):
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files.\nCheck your connection.")

    monkeypatch.setattr(loading.AutoTokenizer, "from_pretrained", unreachable)
    with pytest.raises(loading.ModelConfigError) as caught:
        loading.load_tokenizer({"path": "my-org/not-a-model"})
    assert exit_code_for(caught.value) == EXIT_USER and "\n" not in str(caught.value)
    assert "model.path 'my-org/not-a-model' cannot be loaded: We couldn't connect" in str(caught.value)


def test_validate_json_reports_a_load_error_on_stdout(runner, workdir):
    result = _invoke(runner, "validate", str(_recipe(workdir)), "trainer.total_step=3", "--format", "json")
    assert result.exit_code == 2
    report = json.loads(result.stdout)
    assert report["ok"] is False and report["errors"][0]["key_path"] == "trainer.total_step"
    assert "did you mean 'trainer.total_steps'" in report["errors"][0]["message"]


@pytest.mark.parametrize("overrides, key", [
    (["algorithm.adv_estimator=gae"], "algorithm.adv_estimator"),   # gae without a critic
    (["trainer.mini_batch_size=6"], "trainer.mini_batch_size"),      # does not divide the batch
])
def test_inspect_dispatch_reports_validate_errors_instead_of_a_plan(runner, workdir, overrides, key):
    stderr = _fails(runner, "inspect-dispatch", _recipe(workdir), *overrides)
    assert f"error: {key}" in stderr


def test_inspect_dispatch_shows_each_calls_pool(runner, workdir):
    result = _invoke(runner, "inspect-dispatch", str(_recipe(workdir)), "--format", "json")
    assert result.exit_code == 0, result.output
    pools = {entry["call"]: entry["pool"] for entry in json.loads(result.stdout)["dataflow"]}
    assert pools["actor.generate_sequences"] == "main" and pools["driver: compute_advantages"] == "driver"
    table = _invoke(runner, "inspect-dispatch", str(_recipe(workdir))).stdout
    assert "actor.generate_sequences  ALL_TO_ALL  [main]" in table


def test_the_run_time_call_names_the_same_signature_problem(workdir):
    from rlhfctl.rewards.functions import RewardFunctionError, call_reward_function, load_reward_function

    function = load_reward_function("rewards.py:needs_answer")
    with pytest.raises(RewardFunctionError, match="it needs 'answer'.*data columns: ground_truth"):
        call_reward_function(function, "needs_answer", ["p"], ["r"], {"ground_truth": ["1"]}, on_error="zero")


def test_a_missing_relative_model_path_that_is_no_hub_id(runner, workdir):
    stderr = _fails(runner, "validate", _recipe(workdir), "roles.actor.model.path=runs/sft/model")
    assert "roles.actor.model.path: 'runs/sft/model' is not a local path" in stderr and "not a hub id" in stderr

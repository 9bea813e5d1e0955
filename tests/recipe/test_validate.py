"""validate_recipe: imports, registered methods, files, pools, algorithm needs, batch arithmetic."""

from __future__ import annotations

import pytest

from rlhfctl.recipe import load_recipe, resolve_pools, validate_recipe
from rlhfctl.recipe.errors import RecipeError
from tests.recipe.builders import STUB, recipe_data, write_recipe


def _report(path, *overrides):
    return validate_recipe(load_recipe(path, list(overrides)))


def _errors(report) -> dict:
    return {issue.key_path: issue.message for issue in report.errors}


def _warnings(report) -> dict:
    return {issue.key_path: issue.message for issue in report.warnings}


def test_stub_recipe_is_valid(recipe_file):
    report = _report(recipe_file)
    assert report.ok, report.errors
    assert report.batch.prompts_per_step == 16 and report.batch.samples_per_step == 64


def test_unimportable_worker_names_key_and_import_error(recipe_file):
    report = _report(recipe_file, "roles.actor.worker=no_such_pkg.actor.Actor")
    message = _errors(report)["roles.actor.worker"]
    assert "cannot import 'no_such_pkg.actor.Actor'" in message and "No module named 'no_such_pkg'" in message


def test_worker_attribute_missing_suggests(recipe_file):
    message = _errors(_report(recipe_file, f"roles.actor.worker={STUB}.StubActr"))["roles.actor.worker"]
    assert "has no attribute 'StubActr'" in message and "did you mean 'StubActor'" in message


def test_worker_must_be_a_class(recipe_file):
    assert "not a class" in _errors(_report(recipe_file, f"roles.actor.worker={STUB}:NOT_A_CLASS"))["roles.actor.worker"]


def test_missing_registered_methods(recipe_file):
    message = _errors(_report(recipe_file, f"roles.actor.worker={STUB}.StubActorNoRef"))["roles.actor.worker"]
    assert "update_actor" in message and "defined but not decorated with @register" in message
    assert "compute_ref_log_prob" not in message  # a reference role exists


def test_lora_actor_without_reference_needs_compute_ref_log_prob(recipe_file):
    report = _report(recipe_file, f"roles.actor.worker={STUB}.StubActorNoRef", "roles.actor.lora={r: 4}", "~roles.reference")
    message = _errors(report)["roles.actor.worker"]
    assert "compute_ref_log_prob" in message and "reference" in message
    assert _report(recipe_file, "roles.actor.lora={r: 4}", "~roles.reference").ok


def test_reward_function_must_import(recipe_file, tmp_path):
    report = _report(recipe_file, "roles.reward.function=rlhfctl.tasks.digits:no_such_fn")
    assert "no attribute 'no_such_fn'" in _errors(report)["roles.reward.function"]
    file = tmp_path / "my_reward.py"
    file.write_text("def score(prompts, responses, **columns):\n    raise AssertionError('never called')\n")
    assert _report(recipe_file, f"roles.reward.function={file}:score").ok
    assert "roles.reward.function" in _errors(_report(recipe_file, f"roles.reward.function={tmp_path}/missing.py:score"))


def test_data_files_must_exist_with_a_supported_type(recipe_file, tmp_path):
    good = tmp_path / "train.jsonl"
    good.write_text('{"prompt": "hi"}\n')
    (tmp_path / "notes.txt").write_text("x")
    report = _report(recipe_file, f"data.train_files=[{good},{tmp_path}/absent.jsonl]", f"data.val_files=[{tmp_path}/notes.txt]")
    errors = _errors(report)
    assert set(errors) == {"data.train_files[1]", "data.val_files[0]"}
    assert "data file not found" in errors["data.train_files[1]"] and "create it" in errors["data.train_files[1]"]
    assert "unsupported file type" in errors["data.val_files[0]"]
    assert "data.task" in _warnings(report)  # ignored with files


def test_undeclared_pool(recipe_file):
    report = _report(recipe_file, "roles.reward.pool=mian")
    assert "did you mean 'main'" in _errors(report)["roles.reward.pool"]
    with pytest.raises(RecipeError):
        resolve_pools(load_recipe(recipe_file, ["roles.reward.pool=mian"]))


def test_unused_pool_is_a_warning(recipe_file):
    assert "resource_pools.spare" in _warnings(_report(recipe_file, "resource_pools.spare.use_gpu=false"))


def test_gae_needs_a_critic(recipe_file):
    report = _report(recipe_file, "algorithm.adv_estimator=gae")
    assert "critic" in _errors(report)["algorithm.adv_estimator"]
    with_critic = _report(recipe_file, "algorithm.adv_estimator=gae", f"roles.critic.worker={STUB}.StubCritic")
    assert with_critic.ok, with_critic.errors


def test_unknown_estimator_lists_choices(recipe_file):
    message = _errors(_report(recipe_file, "algorithm.adv_estimator=grop"))["algorithm.adv_estimator"]
    assert "did you mean 'grpo'" in message and "rloo" in message


def test_kl_needs_a_reference(recipe_file):
    report = _report(recipe_file, "~roles.reference")
    assert "reference policy" in _errors(report)["algorithm.kl.use_kl_loss"]
    assert "roles.reference" in _warnings(_report(recipe_file, "algorithm.kl.use_kl_loss=false"))


def test_unimportable_import_module(recipe_file):
    report = _report(recipe_file, "algorithm.import_modules=[no_such_estimators]")
    assert "algorithm.import_modules[0]" in _errors(report)


def test_resume_path_must_exist(recipe_file, tmp_path):
    assert "trainer.resume" in _errors(_report(recipe_file, f"trainer.resume={tmp_path}/ckpt"))
    assert _report(recipe_file, "trainer.resume=auto").ok


def test_positions_must_fit_prompt_and_response(recipe_file):
    report = _report(recipe_file, "roles.actor.model.config.max_position_embeddings=40")
    assert "roles.actor.model.config.max_position_embeddings" in _errors(report)


def test_batch_table_for_two_ranks(recipe_file):
    report = _report(recipe_file, "trainer.mini_batch_size=8", "roles.actor.micro_batch_size=4")
    assert report.ok, report.errors
    shards = {row.call: row for row in report.batch.shards}
    generate = shards["actor.generate_sequences"]
    assert (generate.rows, generate.unit, generate.world_size, generate.rows_per_rank, generate.padding, generate.rows_out) == (16, "prompts", 2, 8, 0, 64)
    reward = shards["reward.compute_rewards"]
    assert (reward.rows, reward.rows_per_rank, reward.padding) == (64, 32, 0)
    (actor,) = report.batch.updates
    assert actor.mini_batches == 2 and actor.mini_batch_samples == 32
    assert actor.mini_batch_rows_per_rank == 16 and actor.micro_batch_size == 4 and actor.grad_accum == 4
    assert actor.optimizer_steps == 2


def test_batch_table_for_three_ranks_flags_what_does_not_divide(recipe_file):
    report = _report(recipe_file, "resource_pools.main.process_on_nodes=[3]")
    shards = {row.call: row for row in report.batch.shards}
    assert (shards["actor.generate_sequences"].rows_per_rank, shards["actor.generate_sequences"].padding) == (6, 2)
    assert (shards["reward.compute_rewards"].rows_per_rank, shards["reward.compute_rewards"].padding) == (22, 2)
    assert "does not split evenly over 3 ranks" in _errors(report)["trainer.mini_batch_size"]
    assert not report.ok


def test_micro_batch_must_divide_the_rank_mini_batch(recipe_file):
    report = _report(recipe_file, "roles.actor.micro_batch_size=5")
    assert "not divisible by micro_batch_size 5" in _errors(report)["roles.actor.micro_batch_size"]
    assert "larger than one mini-batch" in _errors(_report(recipe_file, "roles.actor.micro_batch_size=64"))["roles.actor.micro_batch_size"]


def test_mini_batch_must_divide_the_batch(recipe_file):
    assert "not divisible" in _errors(_report(recipe_file, "trainer.mini_batch_size=6"))["trainer.mini_batch_size"]
    assert "larger than trainer.batch_size" in _errors(_report(recipe_file, "roles.actor.mini_batch_size=32"))["roles.actor.mini_batch_size"]


def test_pools_and_colocation(tmp_path):
    data = recipe_data(resource_pools={"gen": {"process_on_nodes": [2, 2], "use_gpu": True}, "score": {"process_on_nodes": [1]}})
    data["roles"]["actor"]["pool"] = "gen"
    data["roles"]["reference"]["pool"] = "gen"
    data["roles"]["reward"]["pool"] = "score"
    pools = resolve_pools(load_recipe(write_recipe(tmp_path, data)))
    assert pools["gen"].roles == ("actor", "reference") and pools["gen"].world_size == 4 and pools["gen"].gpus == 4
    assert pools["gen"].colocated and not pools["score"].colocated
    assert pools["score"].to_dict()["roles"] == ["reward"]


def test_gpu_shortfall_against_ray_num_gpus(tmp_path):
    data = recipe_data(resource_pools={"main": {"process_on_nodes": [2], "use_gpu": True}}, ray={"num_gpus": 1})
    report = validate_recipe(load_recipe(write_recipe(tmp_path, data)))
    assert "ray.num_gpus" in _errors(report)


def test_report_to_dict_is_json_ready(recipe_file):
    import json

    data = json.loads(json.dumps(_report(recipe_file).to_dict()))
    assert data["ok"] is True and data["batch"]["samples_per_step"] == 64
    assert data["pools"]["main"]["roles"] == ["actor", "reference", "reward"]


def test_a_reward_function_may_run_in_the_driver(tmp_path):
    data = recipe_data()
    data["roles"]["reward"]["pool"] = "driver"
    cfg = load_recipe(write_recipe(tmp_path, data))
    report = validate_recipe(cfg)
    assert not report.errors
    pools = resolve_pools(cfg)
    assert pools["driver"].roles == ("reward",) and pools["driver"].in_driver and pools["driver"].gpus == 0
    assert pools["main"].roles == ("actor", "reference") and not pools["main"].in_driver


def test_only_a_reward_function_runs_in_the_driver(tmp_path):
    data = recipe_data()
    data["roles"]["actor"]["pool"] = "driver"
    assert "only roles.reward can run in the driver" in _errors(validate_recipe(load_recipe(write_recipe(tmp_path, data))))["roles.actor.pool"]
    data = recipe_data()
    data["roles"]["reward"].update(pool="driver", model={"config": {"model_type": "qwen2", "hidden_size": 8}})
    assert "a reward model needs a pool" in _errors(validate_recipe(load_recipe(write_recipe(tmp_path, data))))["roles.reward.pool"]
    data = recipe_data(resource_pools={"main": {"process_on_nodes": [1]}, "driver": {"process_on_nodes": [1]}})
    assert "is reserved" in _errors(validate_recipe(load_recipe(write_recipe(tmp_path, data))))["resource_pools.driver"]


def test_the_batch_table_says_how_many_prompts_each_epoch_leaves_out(recipe_file, tmp_path):
    epoch = _report(recipe_file, "data.num_train=50", "trainer.batch_size=8", "trainer.mini_batch_size=8").batch.epoch
    assert (epoch.prompts, epoch.steps_per_epoch, epoch.dropped_per_epoch, epoch.shuffled) == (50, 6, 2, True)
    exact = _report(recipe_file, "data.num_train=48", "trainer.batch_size=8", "trainer.mini_batch_size=8").batch.epoch
    assert exact.dropped_per_epoch == 0
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(f'{{"prompt": "p{i}"}}\n' for i in range(10)))
    files = _report(recipe_file, f"data.train_files=[{data}]", "data.shuffle=false", "trainer.batch_size=4",
                    "trainer.mini_batch_size=4").batch.epoch
    assert (files.prompts, files.steps_per_epoch, files.dropped_per_epoch, files.shuffled) == (10, 2, 2, False)
    missing = _report(recipe_file, f"data.train_files=[{tmp_path / 'none.jsonl'}]")
    assert missing.batch.epoch is None and "data.train_files[0]" in _errors(missing)

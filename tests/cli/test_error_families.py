"""Exit codes follow the error families of rlhfctl.errors (isinstance), not class names; user errors raised
by the trainer and the reward code exit 2 with their message."""

from __future__ import annotations

import pytest
import typer

from rlhfctl.cli.console import make_console
from rlhfctl.cli.errors import EXIT_DIVERGED, EXIT_INTERNAL, EXIT_USER, EXIT_WORKER_FAILED, exit_code_for, guarded
from rlhfctl.data.errors import DataFileError
from rlhfctl.errors import Diverged, UserError, WorkerLost
from rlhfctl.recipe import load_recipe
from rlhfctl.single_controller.errors import WorkerMethodError


def _exit_and_stderr(error: BaseException, capsys) -> tuple[int, str]:
    with pytest.raises(typer.Exit) as caught:
        with guarded(make_console(stderr=True)):
            raise error
    return caught.value.exit_code, capsys.readouterr().err


def test_a_class_no_table_names_is_classified_by_its_family():
    class SettingsTypo(UserError):
        pass

    class RenamedDataFileError(DataFileError):
        pass

    class LostInTransit(WorkerLost):
        pass

    class LossBecameNan(Diverged):
        pass

    assert exit_code_for(SettingsTypo("x: bad")) == EXIT_USER
    assert exit_code_for(RenamedDataFileError("a.jsonl:1: bad")) == EXIT_USER
    assert exit_code_for(LostInTransit("rank 1 gone")) == EXIT_WORKER_FAILED
    assert exit_code_for(LossBecameNan("step 3: loss is nan")) == EXIT_DIVERGED


def test_a_worker_failure_is_a_user_error_by_its_flag_not_its_text():
    flagged = WorkerMethodError("actor", "ActorWorker", "init_model", 0, "SomeNewName: no model_type", user_error=True)
    assert exit_code_for(flagged) == EXIT_USER
    unflagged = WorkerMethodError("actor", "ActorWorker", "init_model", 0, "ModelConfigError: looks like one", user_error=False)
    assert exit_code_for(unflagged) == EXIT_INTERNAL


def test_no_prompts_exits_2_with_its_message(recipe_file, capsys):
    from rlhfctl.trainer.ppo_trainer import PPOTrainer

    cfg = load_recipe(recipe_file)
    cfg.data.task = None  # past validation (which rejects it): a recipe built in code
    with pytest.raises(UserError) as caught:
        PPOTrainer(cfg, reporter=None)
    code, err = _exit_and_stderr(caught.value, capsys)
    assert code == EXIT_USER
    assert "error: data: set data.train_files or data.task so there are prompts to train on" in err
    assert "Traceback" not in err


def test_an_unknown_algorithm_name_exits_2_with_its_message(recipe_file, capsys):
    from rlhfctl.trainer.run import make_trainer

    cfg = load_recipe(recipe_file)
    cfg.algorithm.name = "reinforce"
    with pytest.raises(UserError) as caught:
        make_trainer(cfg, reporter=None)
    code, err = _exit_and_stderr(caught.value, capsys)
    assert code == EXIT_USER and "error: algorithm.name: 'reinforce' is not one of: ppo, sft, reward_model, dpo" in err


def test_an_unknown_on_error_policy_exits_2_with_its_message(capsys):
    from rlhfctl.rewards.functions import call_reward_function

    with pytest.raises(UserError) as caught:
        call_reward_function(lambda prompts, responses: [0.0], "fn", ["p"], ["r"], {}, on_error="ignore")
    code, err = _exit_and_stderr(caught.value, capsys)
    assert code == EXIT_USER and "error: roles.reward.on_error must be one of ('raise', 'zero'), got 'ignore'" in err

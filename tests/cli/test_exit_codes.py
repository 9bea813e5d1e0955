"""The exception -> exit code mapping (rlhfctl.cli.errors) and its messages."""

from __future__ import annotations

import pytest
import typer

from rlhfctl.cli.console import make_console
from rlhfctl.cli.errors import EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_USER, exit_code_for, guarded, user_message
from rlhfctl.data.errors import DataConfigError, DataFileError
from rlhfctl.models import ModelConfigError
from rlhfctl.recipe import RecipeError
from rlhfctl.single_controller.errors import ResourcePoolError, WorkerMethodError


@pytest.mark.parametrize("error, code", [
    (RecipeError("trainer.x: bad", key_path="trainer.x"), EXIT_USER),
    (DataFileError("data.jsonl:3: bad record"), EXIT_USER),
    (DataConfigError("batch larger than dataset"), EXIT_USER),
    (ModelConfigError("model.config needs a model_type"), EXIT_USER),
    (ResourcePoolError("pool does not fit"), EXIT_USER),
    (KeyboardInterrupt(), EXIT_INTERRUPTED),
    (RuntimeError("bug"), EXIT_INTERNAL),
    (ValueError("plain value error"), EXIT_INTERNAL),
    (WorkerMethodError("actor", "ActorWorker", "init_model", 0, "ModelConfigError: no model_type"), EXIT_USER),
    (WorkerMethodError("actor", "ActorWorker", "update_actor", 1, "RuntimeError: CUDA"), EXIT_INTERNAL),
])
def test_exit_code_for(error, code):
    assert exit_code_for(error) == code


def test_worker_user_error_message_is_one_line():
    error = WorkerMethodError("actor", "ActorWorker", "init_model", 0, "ModelConfigError: no model_type", "Traceback...\nlines")
    assert user_message(error) == "actor.init_model (rank 0): ModelConfigError: no model_type"


def _run_guarded(error: BaseException) -> int:
    with pytest.raises(typer.Exit) as caught:
        with guarded(make_console(stderr=True)):
            raise error
    return caught.value.exit_code


def test_guarded_maps_and_prints(capsys):
    assert _run_guarded(DataFileError("data.jsonl:3: not JSON")) == EXIT_USER
    err = capsys.readouterr().err
    assert "error: data.jsonl:3: not JSON" in err and "Traceback" not in err
    assert _run_guarded(KeyboardInterrupt()) == EXIT_INTERRUPTED
    assert "interrupted" in capsys.readouterr().err
    assert _run_guarded(RuntimeError("boom")) == EXIT_INTERNAL
    err = capsys.readouterr().err
    assert "Traceback" in err and "internal error: RuntimeError: boom" in err

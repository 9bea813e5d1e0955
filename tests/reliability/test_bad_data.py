"""Bad data files through the real `rlhfctl train`: exit 2, one message naming file and line, nothing started."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from rlhfctl.cli.app import app


def write(path, content: bytes):
    path.write_bytes(content)
    return path


CASES = {
    "malformed JSON on line 3": (b'{"prompt": "a"}\n{"prompt": "b"}\n{"prompt": \n', ["line 3"]),
    "empty file": (b"", ["empty"]),
    "missing prompt column": (b'{"prompt": "a"}\n{"question": "b"}\n', ["record 2", "'prompt'"]),
    "undecodable bytes": (b'{"prompt": "a"}\n{"prompt": "\xff\xfe"}\n', ["line 2"]),
    "prompt over max_prompt_length": (json.dumps({"prompt": "x" * 100}).encode() + b"\n", ["max_prompt_length", "100"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_training_data_exits_2_naming_the_file_and_where(tmp_path, case):
    content, expected = CASES[case]
    data = write(tmp_path / "train.jsonl", content)
    result = CliRunner().invoke(app, [
        "train", "quickstart", "ray.backend=local", f"trainer.output_dir={tmp_path / 'run'}",
        f"data.train_files=[{data}]", "data.max_prompt_length=32", "trainer.batch_size=1", "trainer.mini_batch_size=1",
    ])
    output = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert "train.jsonl" in output
    for text in expected:
        assert text in output, (text, output)
    assert "Traceback" not in result.output
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_missing_data_file_is_caught_before_launch(tmp_path):
    result = CliRunner().invoke(app, ["train", "quickstart", f"data.train_files=[{tmp_path / 'nope.jsonl'}]",
                                      f"trainer.output_dir={tmp_path / 'run'}"])
    assert result.exit_code == 2
    assert "nope.jsonl" in " ".join(result.output.split())

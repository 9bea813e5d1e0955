"""An LLM judge as the reward, end to end: ``rlhfctl train`` with roles.reward.judge (a tiny inline judge model and a
deterministic parser) trains on the scores the judge's own verdicts parse to, logs each verdict beside its sample,
and counts the verdicts that do not parse in reward/judge_parse_errors."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from rlhfctl.cli import app
from tests.rewards import judge_parsers

pytestmark = pytest.mark.slow

JUDGE = ("{model: {config: {model_type: qwen2, hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2, "
         "num_key_value_heads: 2, intermediate_size: 64, max_position_embeddings: 256}}, "
         "template: '{prompt}|{response}|{reference}|{rubric}>', rubric: digits, max_new_tokens: 6, "
         "score_range: [0.0, 5.0], parse_error_score: 0.5, temperature: 1.0}")  # sampled: a random tiny judge's
# greedy verdict is the same for every prompt

# The parser the reward worker loads: first_char, and a line per verdict it reads in a log of its own (every
# verdict, not only the first response of each prompt that samples.jsonl keeps).
PARSER = '''import json
from tests.rewards.judge_parsers import first_char

def parse(verdict):
    with open({log!r}, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(verdict) + "\\n")
    return first_char(verdict)
'''


def test_two_steps_train_on_the_judges_parsed_verdicts_and_count_its_parse_errors(ray_session, tmp_path):
    output, log = tmp_path / "run", tmp_path / "verdicts.jsonl"
    (tmp_path / "logging_parser.py").write_text(PARSER.format(log=str(log)))
    overrides = [
        f"roles.reward.judge={JUDGE}", f"roles.reward.judge.parser={tmp_path / 'logging_parser.py'}:parse",
        "trainer.total_steps=2", "trainer.batch_size=4", "trainer.mini_batch_size=4", "rollout.n=2",
        "rollout.max_new_tokens=8", "trainer.log_samples=4", f"trainer.output_dir={output}",
    ]
    result = CliRunner().invoke(app, ["train", "recipes/quickstart.yaml", *overrides, "--quiet"])
    assert result.exit_code == 0, result.output
    steps = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [step["step"] for step in steps] == [1, 2]

    # Every sample the actor trained on was judged: its score is the parse of the verdict logged beside it.
    samples = [json.loads(line) for line in (output / "samples.jsonl").read_text().splitlines() if line.strip()]
    assert len(samples) == 8  # 4 prompts (their first response) x 2 steps
    for sample in samples:
        parsed = judge_parsers.first_char(sample["judge_verdict"])
        assert sample["score"] == (0.5 if parsed is None else min(parsed, 5.0)), sample

    # Every verdict of the run (8 samples a step): reward/judge_parse_errors counts the ones that do not parse.
    verdicts = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(verdicts) == 16
    assert {sample["judge_verdict"] for sample in samples} <= set(verdicts)
    failures = sum(judge_parsers.first_char(verdict) is None for verdict in verdicts)
    assert 0 < failures < len(verdicts)  # some verdicts parse and some do not (first_char: about a third fail)
    assert sum(step["reward/judge_parse_errors"] for step in steps) == failures
    for step, own in zip(steps, (verdicts[:8], verdicts[8:])):
        assert step["reward/judge_parse_errors"] == sum(judge_parsers.first_char(v) is None for v in own)
        scores = [0.5 if judge_parsers.first_char(v) is None else min(judge_parsers.first_char(v), 5.0) for v in own]
        assert step["score/mean"] == pytest.approx(sum(scores) / len(scores))

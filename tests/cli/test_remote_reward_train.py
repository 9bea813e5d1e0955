"""rlhfctl train with roles.reward.remote: the reference service (examples/remote_reward_server.py) scores a tiny
quickstart run whose reward metrics arrive in metrics.jsonl, and a service that is down stops the run with exit 3
naming its URL, in one line."""

from __future__ import annotations

import importlib.util
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlhfctl.cli import app
from tests.rewards.reward_services import refused_url

ROOT = Path(__file__).resolve().parents[2]
TINY = ["trainer.total_steps=2", "trainer.batch_size=4", "trainer.mini_batch_size=4", "rollout.n=2",
        "rollout.max_new_tokens=8", "data.num_train=8", "data.num_val=0"]


@pytest.fixture
def example_service() -> Iterator[str]:
    """The reference reward service, serving on a free 127.0.0.1 port in this process; its URL."""
    spec = importlib.util.spec_from_file_location("remote_reward_server", ROOT / "examples" / "remote_reward_server.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    server = module.make_server(0)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/score"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.mark.slow
def test_a_quickstart_run_scored_by_the_example_service_logs_its_reward_metrics(ray_session, example_service, tmp_path):
    result = CliRunner().invoke(app, [
        "train", str(ROOT / "recipes" / "quickstart.yaml"), f"trainer.output_dir={tmp_path}", *TINY,
        f"roles.reward.remote.url={example_service}", "roles.reward.remote.columns=[ground_truth]",
        "roles.reward.remote.batch_size=3", "--quiet"])
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [record["step"] for record in records] == [1, 2]
    for record in records:
        assert 0.0 <= record["score/mean"] <= 1.0  # the digit fraction the service computes
        assert record["reward/length/mean"] > 0.0  # extra.length: characters of the decoded responses
        assert record["reward/exact/mean"] in (0.0, 0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0)  # 8 samples
        assert record["reward/remote_retries"] == 0.0
        assert record["reward/mean"] == pytest.approx(record["score/mean"])


def test_a_service_that_is_down_stops_the_run_with_exit_3_naming_the_url(tmp_path):
    url = refused_url()
    result = CliRunner().invoke(app, [
        "train", str(ROOT / "recipes" / "quickstart.yaml"), f"trainer.output_dir={tmp_path}", *TINY,
        "trainer.total_steps=1", "ray.backend=local", f"roles.reward.remote.url={url}",
        "roles.reward.remote.max_retries=1", "roles.reward.remote.timeout_s=0.5", "roles.reward.remote.backoff_s=0.1",
        "roles.reward.on_error=zero", "--quiet"])
    assert result.exit_code == 3, result.output
    assert url in result.stderr and "did not answer after 2 tries" in result.stderr
    assert "ConnectionRefusedError" in result.stderr and "Traceback" not in result.output + result.stderr
    assert not (tmp_path / "metrics.jsonl").exists() or not (tmp_path / "metrics.jsonl").read_text().strip()

"""Loading and saving without one giant host (issue 35, point 5), on real Ray ranks with gloo at world 2:
each FSDP2 rank reads only its own rows from a ``save_pretrained`` directory, and the Hugging Face export
streams tensor by tensor into bounded files that ``from_pretrained`` loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from rlhfctl.models.loading import load_causal_lm
from tests.workers.conftest import local_group, ray_role_group
from tests.workers.recipes import TINY_MODEL, tiny_recipe, tokenizer
from tests.workers.sharded_workers import ShardedLoadActor, ShardedLoadCritic
from tests.workers.test_engine import PROMPT, fixed_batch
from workers import ActorWorker
from rlhfctl.engine.sharded_load import shard_rows


def saved_model(directory: Path, tie: bool) -> Path:
    """A tiny qwen2 written by ``save_pretrained`` (float32 safetensors), with its tokenizer."""
    config = {**TINY_MODEL["config"], "tie_word_embeddings": tie, "hidden_size": 40, "intermediate_size": 72}
    model = load_causal_lm({"config": config}, tokenizer(), dtype=torch.float32, seed=11)
    model.save_pretrained(directory)
    tokenizer().save_pretrained(directory)
    return directory


def path_recipe(path: Path, **actor):
    recipe = tiny_recipe(roles={"actor": {"model": {"path": str(path), "dtype": "float32"}, **actor}})
    recipe["roles"]["actor"]["model"].pop("config")
    return recipe


def ray_group(recipe, name: str, worker=ShardedLoadActor, world: int = 2, role: str = "actor"):
    """A group of ``world`` ranks of ``worker`` (see ``ray_role_group``)."""
    return ray_role_group(worker, recipe, role, name, world)


def file_tensors(directory: Path) -> dict[str, torch.Tensor]:
    tensors = {}
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            tensors.update({name: handle.get_tensor(name) for name in handle.keys()})
    return tensors


def test_shard_rows_follow_torch_chunk():
    for rows in (0, 1, 5, 7, 8, 64):
        for world in (1, 2, 3, 4):
            chunks = torch.arange(rows).chunk(world) if rows else ()
            for rank in range(world):
                start, stop = shard_rows(rows, rank, world)
                expected = chunks[rank].tolist() if rank < len(chunks) else []
                assert list(range(start, stop)) == expected, (rows, world, rank)


@pytest.mark.slow
@pytest.mark.parametrize("tie", [True, False])
def test_fsdp2_ranks_load_their_own_rows_and_export_streams_into_bounded_files(ray_session, tmp_path, tie):
    source = saved_model(tmp_path / "source", tie)
    batch = fixed_batch()
    with local_group(ActorWorker, path_recipe(source), "actor") as whole:  # today's full load, one rank
        expected = whole.compute_log_prob(batch).batch["old_log_probs"]
    with ray_group(path_recipe(source, strategy="fsdp2"), f"sharded-load-{tie}") as group:
        reports = group.load_report()
        log_probs = group.compute_log_prob(batch).batch["old_log_probs"]
        group.export_bounded(str(tmp_path / "small"), 20_000)
        group.export_bounded(str(tmp_path / "one"), 2**31)
    torch.testing.assert_close(log_probs, expected, atol=0, rtol=0)  # the same weights, bit for bit

    # Each rank read its own rows only: together the files once, each about half, no tensor whole.
    source_tensors = file_tensors(source)
    total = sum(t.numel() * t.element_size() for t in source_tensors.values())
    largest = max(t.numel() * t.element_size() for t in source_tensors.values())
    assert all(report is not None and report["fresh"] == [] for report in reports)
    assert sum(report["bytes_read"] for report in reports) == total
    assert all(report["bytes_read"] <= 0.55 * total for report in reports)
    assert all(report["largest_read"] <= largest // 2 + largest // 40 for report in reports)

    # The export holds the source's tensors bit for bit (same names, dtypes), split in several files.
    for name in ("small", "one"):
        exported = file_tensors(tmp_path / name)
        assert sorted(exported) == sorted(source_tensors), name
        for key, tensor in source_tensors.items():
            assert exported[key].dtype == tensor.dtype and torch.equal(exported[key], tensor), (name, key)
    files = sorted(p.name for p in (tmp_path / "small").glob("*.safetensors"))
    index = json.loads((tmp_path / "small" / "model.safetensors.index.json").read_text())
    assert len(files) >= 3 and sorted(set(index["weight_map"].values())) == files
    assert all((tmp_path / "small" / f).stat().st_size <= 20_000 + 4096 for f in files)  # bound + header
    assert index["metadata"]["total_size"] == total
    assert [p.name for p in (tmp_path / "one").glob("*.safetensors")] == ["model.safetensors"]

    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "small").eval()
    with torch.no_grad():
        logits = loaded(input_ids=batch.batch["input_ids"], attention_mask=batch.batch["attention_mask"]).logits
    direct = torch.log_softmax(logits[:, PROMPT - 1 : -1].float(), -1).gather(-1, batch.batch["responses"][..., None]).squeeze(-1)
    torch.testing.assert_close(direct, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_tensors_the_files_lack_start_alike_a_lora_adapter_and_a_critic_head(ray_session, tmp_path):
    source = saved_model(tmp_path / "source", tie=False)
    batch = fixed_batch()
    with local_group(ActorWorker, path_recipe(source), "actor") as whole:
        expected = whole.compute_log_prob(batch).batch["old_log_probs"]
    with ray_group(path_recipe(source, strategy="fsdp2", lora={"r": 4, "alpha": 8}), "sharded-lora") as group:
        reports = group.load_report()
        policy = group.compute_log_prob(batch).batch["old_log_probs"]
        reference = group.compute_ref_log_prob(batch).batch["ref_log_prob"]
        group.export_bounded(str(tmp_path / "lora"), 2**31)
    fresh = reports[0]["fresh"]
    assert fresh == reports[1]["fresh"] and len(fresh) == 2 * 7 * 2 and all(".lora_" in name for name in fresh)
    # lora_B starts at zero: the adapted model is the base, bit for bit, and so is the merged export.
    torch.testing.assert_close(policy, expected, atol=0, rtol=0)
    torch.testing.assert_close(reference, expected, atol=0, rtol=0)
    exported, source_tensors = file_tensors(tmp_path / "lora"), file_tensors(source)
    assert sorted(exported) == sorted(source_tensors)
    assert all(torch.equal(exported[name], tensor) for name, tensor in source_tensors.items())

    critic = tiny_recipe(roles={"critic": {"model": {"path": str(source), "dtype": "float32"}, "strategy": "fsdp2"}})
    with ray_group(critic, "sharded-critic", worker=ShardedLoadCritic, role="critic") as group:
        reports = group.load_report()
        values = group.compute_values(batch).batch["values"]
        group.export_hf(str(tmp_path / "critic"))
    assert [report["fresh"] for report in reports] == [["score.bias", "score.weight"]] * 2
    assert values.shape == batch.batch["responses"].shape and torch.isfinite(values).all() and values.std() > 0
    exported = file_tensors(tmp_path / "critic")
    backbone = {name: tensor for name, tensor in source_tensors.items() if name.startswith("model.")}
    assert all(torch.equal(exported[name], tensor) for name, tensor in backbone.items())
    assert exported["score.weight"].shape == (1, 40) and exported["score.weight"].abs().sum() > 0


def test_a_checkpoint_missing_a_layer_tensor_is_not_shardable_and_bin_files_are_not_read(tmp_path):
    from safetensors.torch import load_file, save_file

    from rlhfctl.engine.placement import decoder_layers
    from rlhfctl.engine.sharded_load import CheckpointIndex, NotShardable, checkpoint_directory, parameters_on_meta, plan_sources

    source = saved_model(tmp_path / "source", tie=True)
    with parameters_on_meta():
        model = load_causal_lm({"config": {**TINY_MODEL["config"], "tie_word_embeddings": True, "hidden_size": 40,
                                           "intermediate_size": 72}}, tokenizer(), seed=0)
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert {b.device.type for b in model.buffers()} == {"cpu"}  # inv_freq computed, as at init
    sources = plan_sources(model, CheckpointIndex(source), decoder_layers(model))
    assert sources["model.embed_tokens.weight"] == "model.embed_tokens.weight" and "lm_head.weight" not in sources

    state = load_file(str(source / "model.safetensors"))
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, str(source / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(NotShardable, match="model.layers.1.mlp.up_proj.weight"):
        plan_sources(model, CheckpointIndex(source), decoder_layers(model))
    (source / "model.safetensors").rename(source / "weights.bin")
    assert checkpoint_directory({"path": str(source)}) is None

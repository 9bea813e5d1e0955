"""How rlhfctl/engine/placement.py places a role's weights: frozen bf16 roles keep float32 rotary buffers, ties
survive the cast, and FSDP2 with CPU offload loads at world 2 (the broadcasts run where the group's
backend reaches: the device under NCCL, the host under gloo)."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import AutoModelForCausalLM, Qwen2Config

from rlhfctl.models.loading import cast_parameters, load_causal_lm
from tests.workers.conftest import local_group
from tests.workers.recipes import tiny_recipe
from workers import ReferenceWorker
from rlhfctl.engine import placement as engine_module
from rlhfctl.engine.placement import EngineSettings, collective_device, full_state_dict, materialize

BF16 = {"model": {"dtype": "bfloat16", "config": {"rope_theta": 1e6}}}


def _floating_buffers(model: torch.nn.Module) -> dict[str, torch.dtype]:
    return {name: buffer.dtype for name, buffer in model.named_buffers() if buffer.is_floating_point()}


def test_a_frozen_bf16_reference_keeps_float32_rotary_buffers_under_both_strategies():
    for strategy in ("ddp", "fsdp2"):
        recipe = tiny_recipe(roles={"actor": BF16, "reference": {"strategy": strategy}})
        with local_group(ReferenceWorker, recipe, "reference") as reference:
            model = reference.workers[0].model
            assert {p.dtype for p in model.parameters()} == {torch.bfloat16}, strategy
            buffers = _floating_buffers(model)
            assert "model.rotary_emb.inv_freq" in buffers
            assert set(buffers.values()) == {torch.float32}, (strategy, buffers)
            if strategy == "fsdp2":
                dist.destroy_process_group()  # the world-1 group the FSDP2 reference started


def test_cast_parameters_keeps_tied_weights_tied_and_buffers_as_they_are():
    config = Qwen2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                         intermediate_size=64, vocab_size=50, tie_word_embeddings=True)
    model = AutoModelForCausalLM.from_config(config)
    cast_parameters(model, torch.bfloat16)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert model.lm_head.weight.dtype == torch.bfloat16
    assert set(_floating_buffers(model).values()) == {torch.float32}


def test_a_model_loaded_from_a_directory_in_bf16_keeps_float32_buffers(tmp_path):
    config = Qwen2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                         intermediate_size=64, vocab_size=64)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "model")
    from rlhfctl.models.tokenizer import CharTokenizer

    model = load_causal_lm({"path": str(tmp_path / "model")}, CharTokenizer(), dtype=torch.bfloat16)
    assert next(model.parameters()).dtype == torch.bfloat16
    assert set(_floating_buffers(model).values()) == {torch.float32}


# ------------------------------------------------------------------ FSDP2 with CPU offload at world 2

_CONFIG = {"model_type": "qwen2", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
           "num_key_value_heads": 2, "intermediate_size": 64, "vocab_size": 64, "max_position_embeddings": 64}


def _build(cfg: dict) -> torch.nn.Module:
    config = Qwen2Config(**{k: v for k, v in cfg["config"].items() if k != "model_type"})
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config)


def _offloaded_rank(rank: int, init_file: str, results: dict) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        settings = EngineSettings("fsdp2", torch.bfloat16, trainable=False, cpu_offload=True)
        module, _ = materialize(_build, {"config": _CONFIG}, settings, torch.device("cpu"))
        ids = torch.arange(3, 19).unsqueeze(0)
        with torch.no_grad():
            logits = module(input_ids=ids).logits
        state = full_state_dict(module)
        results[rank] = {
            "logits": logits,
            "buffers": {name: buffer.clone() for name, buffer in module.named_buffers()},
            "state": state,
        }
    finally:
        dist.destroy_process_group()


def test_fsdp2_with_cpu_offload_loads_at_world_2_with_rank_0s_weights_and_buffers(tmp_path):
    results = mp.Manager().dict()
    mp.spawn(_offloaded_rank, args=(str(tmp_path / "rendezvous"), results), nprocs=2, join=True)
    plain = cast_parameters(_build({"config": _CONFIG}), torch.bfloat16)
    with torch.no_grad():
        expected = plain(input_ids=torch.arange(3, 19).unsqueeze(0)).logits
    for rank in (0, 1):
        torch.testing.assert_close(results[rank]["logits"], expected, rtol=0, atol=0)
        for name, buffer in plain.named_buffers():
            assert results[rank]["buffers"][name].dtype == torch.float32
            torch.testing.assert_close(results[rank]["buffers"][name], buffer, rtol=0, atol=0)
    for name, tensor in plain.state_dict().items():
        torch.testing.assert_close(results[0]["state"][name], tensor, rtol=0, atol=0, msg=name)


def test_loads_broadcast_on_the_device_under_nccl_and_on_the_host_under_gloo(monkeypatch):
    cuda = torch.device("cuda", 3)
    monkeypatch.setattr(engine_module.dist, "is_initialized", lambda: True)
    for backend, expected in (("nccl", cuda), ("cpu:gloo,cuda:nccl", cuda), ("gloo", torch.device("cpu"))):
        monkeypatch.setattr(engine_module.dist, "get_backend", lambda group=None, b=backend: b)
        assert collective_device(cuda) == expected, backend
    monkeypatch.setattr(engine_module.dist, "is_initialized", lambda: False)
    assert collective_device(cuda) == torch.device("cpu")

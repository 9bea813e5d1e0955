"""LoRA actor: only the adapter trains, the adapter-off model is the reference, adapter-only
checkpoints, and a merged Hugging Face export."""

from __future__ import annotations

from pathlib import Path

import torch

from rlhfctl.models.loading import load_causal_lm
from tests.workers.conftest import local_group
from tests.workers.recipes import TINY_MODEL, digits_prompts, tiny_recipe, tokenizer
from tests.workers.test_actor import direct_log_probs, with_advantages
from workers import ActorWorker

LORA_RECIPE = tiny_recipe(roles={"actor": {"lora": {"r": 4, "alpha": 8}, "optim": {"lr": 5e-2}}})


def test_lora_actor_trains_only_the_adapter_and_serves_reference_log_probs(tmp_path):
    from transformers import AutoModelForCausalLM

    with local_group(ActorWorker, LORA_RECIPE, "actor") as actor:
        module = actor.workers[0].module
        before = {name: p.detach().clone() for name, p in module.named_parameters()}
        trainable = {name for name, p in module.named_parameters() if p.requires_grad}
        assert trainable and all("lora_" in name for name in trainable)

        rollout = actor.generate_sequences(digits_prompts(3))
        for seed in range(2):  # two steps: lora_B leaves zero first, then lora_A moves too
            actor.update_actor(with_advantages(rollout, seed=seed))
        changed = {name for name, p in module.named_parameters() if not torch.equal(p, before[name])}
        assert changed and changed <= trainable
        assert any("lora_A" in name for name in changed) and any("lora_B" in name for name in changed)

        # Adapter off = the untouched base model.
        base = load_causal_lm(TINY_MODEL, tokenizer(), seed=0).eval()
        base_log_probs, _ = direct_log_probs(base, rollout)
        ref = actor.compute_ref_log_prob(rollout)
        assert set(ref.batch) == {"ref_log_prob"}
        mask = rollout.batch["response_mask"]  # pad cells: 0 padding-free, whatever the padded pass gives
        torch.testing.assert_close(ref.batch["ref_log_prob"] * mask, base_log_probs * mask, atol=1e-5, rtol=1e-5)
        policy = actor.compute_log_prob(rollout).batch["old_log_probs"]
        assert not torch.allclose(policy, base_log_probs, atol=1e-4)

        # The checkpoint holds the adapter, not the full weights.
        (saved,) = actor.save_checkpoint(str(tmp_path / "ckpt"))
        files = {path.relative_to(saved).as_posix() for path in Path(saved).rglob("*") if path.is_file()}
        assert {"adapter/adapter_config.json", "adapter/adapter_model.safetensors"} <= files
        assert "model.safetensors" not in files

        # Export: a plain model directory whose logits equal the adapted model's.
        exported = actor.export_hf(str(tmp_path / "hf"))
        loaded = AutoModelForCausalLM.from_pretrained(exported).eval()
        assert not any("lora" in name for name, _ in loaded.named_parameters())
        batch = rollout.batch
        with torch.no_grad():
            inputs = dict(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
            )
            torch.testing.assert_close(loaded(**inputs).logits, module(**inputs).logits, atol=1e-5, rtol=1e-5)

        # Reloading the adapter checkpoint brings the adapter weights back after another step.
        fingerprint = actor.state_fingerprint()[0]
        actor.update_actor(with_advantages(rollout, seed=5))
        assert actor.state_fingerprint()[0] != fingerprint
        actor.load_checkpoint(str(tmp_path / "ckpt"))
        assert actor.state_fingerprint()[0] == fingerprint
        torch.testing.assert_close(actor.compute_log_prob(rollout).batch["old_log_probs"], policy)

"""The model sizes both sides of the TRL comparison time: ``train_step.py`` (ours) and ``trl_grpo_baseline.py``.

Each size names its whole architecture, so nothing comes from the quickstart's own model (whose 2 heads
differ); ``vs_trl.py`` checks that the two sides built the same model before it times anything.
"""

SIZES = {
    "tiny": {"label": "tiny (h64 x2)", "new_tokens": 32,
             "model": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
                       "intermediate_size": 128, "max_position_embeddings": 128}},
    "small": {"label": "small (h256 x4)", "new_tokens": 32,
              "model": {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4,
                        "intermediate_size": 512, "max_position_embeddings": 128}},
    "33m": {"label": "33m (h512 x8)", "new_tokens": 128,
            "model": {"hidden_size": 512, "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 4,
                      "intermediate_size": 2048, "max_position_embeddings": 256}},
}

"""The day after training: score a trained policy on held-out prompts (``rlhfctl eval``) and sample from it
(``rlhfctl generate``), through the same worker groups, rollout and reward code as training."""

"""The model engine the role workers run on: placement and precision (FSDP2 or DDP), the forward passes and their
log-probs, the update's micro-batches and packing, LoRA, offload, checkpoints, the Hugging Face export and seeding.

Nothing here knows a role: the worker classes in ``workers/`` compose these pieces.
"""

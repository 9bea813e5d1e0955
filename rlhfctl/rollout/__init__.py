"""The rollout, in one place: everything between a step's prompts and its scored samples.

- The engines: :mod:`~rlhfctl.rollout.generation` (hf sampling, with :mod:`~rlhfctl.rollout.kv_cache`,
  :mod:`~rlhfctl.rollout.decode_mask`, :mod:`~rlhfctl.rollout.fast_decode`), :mod:`~rlhfctl.rollout.vllm_engine`
  and :mod:`~rlhfctl.rollout.agent_rollout` (multi-turn); :mod:`~rlhfctl.rollout.prompt_sharing` runs a scoring
  pass's prompt once per distinct prompt.
- The schedules the trainer drives: :mod:`~rlhfctl.rollout.colocated` (the actor's ranks generate) and
  :mod:`~rlhfctl.rollout.separate` (a rollout group on a pool of its own), with :mod:`~rlhfctl.rollout.staleness`
  (``trainer.max_staleness``) and :mod:`~rlhfctl.rollout.dynamic_sampling` (DAPO's group filter).
- The weight channel, both ends: :mod:`~rlhfctl.rollout.weight_channel` (the bucketed broadcast),
  :mod:`~rlhfctl.rollout.weight_sender` (the actor's end), :mod:`~rlhfctl.rollout.weight_sync` (the driver's) and
  :mod:`~rlhfctl.rollout.sync_probe` (the check after a sync).
"""

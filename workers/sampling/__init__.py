"""Decoding for the actor's rollouts: sampling, the preallocated KV cache, the fast decoding step, the decode mask.

:mod:`~workers.sampling.generation` samples ``rollout.n`` responses per prompt and is what the actor
calls; :mod:`~workers.sampling.kv_cache`, :mod:`~workers.sampling.decode_mask` and
:mod:`~workers.sampling.fast_decode` make its decoding steps cheaper with the same numbers;
:mod:`~workers.sampling.prompt_sharing` runs the prompt part of a scoring pass once per distinct prompt.
"""

"""A support library for backend authors: the code that twin plugins of one kind share,
so that a new engine or trainer backend starts from it instead of copying a sibling.

- :mod:`~rollart_sdk.backends.engine_adapter`: the half of an engine adapter that the
  vLLM and SGLang engines share (request bookkeeping, weight staging, bucket checks);
- :mod:`~rollart_sdk.backends.objective`: the decoupled PPO objective and its statistics
  (clip fraction, KL, entropy, importance weights, mismatch), one function every trainer
  backend calls;
- :mod:`~rollart_sdk.backends.distributed`: the torch.distributed set-up and the small
  collectives trainers share (process group, flat all-reduce, advantages over ranks);
- :mod:`~rollart_sdk.backends.trainer_options`: :class:`TrainerOptionsBase`, the AdamW,
  loss, advantage and runtime options every trainer backend takes;
- :mod:`~rollart_sdk.backends.schedules`: learning-rate schedules and their options.

This package imports nothing itself: ``objective`` and ``distributed`` import torch,
``trainer_options`` and ``schedules`` do not (a config is validated without torch).
"""

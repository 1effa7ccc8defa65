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
- :mod:`~rollart_sdk.backends.schedules`: learning-rate schedules and their options;
- :mod:`~rollart_sdk.backends.precision`: :class:`PrecisionOptions`, the mixed-precision
  options (fp32 master weights, loss scaling) every trainer takes, torch-free;
- :mod:`~rollart_sdk.backends.master_weights`: the optimizer wrapper that implements
  them (fp32 masters, float16 loss scaling), shared by trainers ``torch`` and ``megatron``.

This package imports nothing itself: ``objective``, ``distributed`` and
``master_weights`` import torch, ``trainer_options``, ``schedules`` and ``precision`` do
not (a config is validated without torch).
"""

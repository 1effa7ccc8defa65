"""rollart-trainer-megatron: GRPO / PPO-clip on megatron-core (tensor + data parallel).

Importing this package is cheap; ``rollart_trainer_megatron.trainer`` imports torch and
megatron-core.
"""

__version__ = "0.1.0"

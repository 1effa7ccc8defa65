"""rollart-trainer-torch: the default GRPO trainer (PyTorch, Hugging Face causal LMs).

Importing this package is cheap; ``rollart_trainer_torch.trainer`` imports torch.
"""

__version__ = "0.1.0"

"""rollart weight transport "nccl": each policy version broadcast from the trainer's rank 0
to every engine worker in a process group of its own (NCCL on GPUs, gloo on CPU),
``style = "push"``."""

__version__ = "0.1.0"

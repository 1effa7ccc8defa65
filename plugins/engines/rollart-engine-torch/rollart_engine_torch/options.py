"""Options of engine ``torch`` (validated from ``engine.options`` in a run config).

Kept free of torch imports so configs validate without loading the engine.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class TorchEngineOptions(BaseModel):
    """How the embedded engine batches and how much KV-cache memory it may hold.

    The KV cache holds at most ``max_running`` sequences of at most ``max_seq_len`` tokens
    each: ``2 * layers * max_running * max_seq_len * kv_heads * head_dim * dtype bytes``.
    It is allocated as needed (doubling) up to that bound, never sized from free memory;
    requests beyond ``max_running`` wait in the queue.
    """

    model_config = ConfigDict(extra="forbid")

    device: str = "cpu"
    max_running: int = Field(16, ge=1, description="sequences decoded together (KV slots)")
    max_seq_len: int = Field(
        2048, ge=2, description="prompt + generated tokens per sequence (capped by the model)"
    )
    max_prefill_tokens: int = Field(
        4096, ge=1, description="new prompt tokens admitted per engine step (bounds step time)"
    )
    num_threads: int | None = Field(None, ge=1, description="torch intra-op threads; None: keep")
    eos_token_ids: list[int] | None = Field(
        None, description="ids that end a generation besides stop_token_ids; None: the model's"
    )
    seed: int = Field(0, description="seeds requests that give no seed of their own")

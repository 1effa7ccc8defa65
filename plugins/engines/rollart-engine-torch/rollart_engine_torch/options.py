"""Options of engine ``torch`` (validated from ``engine.options`` in a run config).

Kept free of torch imports so configs validate without loading the engine.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class TorchEngineOptions(BaseModel):
    """How the embedded engine batches and how much KV-cache memory it may hold.

    The KV cache holds ``kv_slots`` sequences of at most ``max_seq_len`` tokens each:
    ``2 * layers * kv_slots * max_seq_len * kv_heads * head_dim * dtype bytes``. It is
    allocated as needed (doubling) up to that bound, never sized from free memory;
    requests beyond ``max_running`` wait in the queue. Slots beyond the running ones keep
    finished turns' K/V for their trajectories' next turns (``reuse_kv``), least recently
    used evicted first.
    """

    model_config = ConfigDict(extra="forbid")

    device: str = Field("cpu", description="where the model runs: cpu, cuda or cuda:N")
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
    reuse_kv: bool = Field(
        True, description="keep a trajectory's KV between its turns (prefix reuse)"
    )
    kv_slots: int | None = Field(
        None, ge=1, description="KV slots in all (running + kept); None: 2 x max_running "
        "with reuse_kv, else max_running"
    )
    batch_wait_s: float = Field(
        0.002, ge=0, le=1, description="before a step, wait this long at most for requests "
        "that are still arriving, so they join one batched forward"
    )
    abort_memory: int = Field(
        4096, ge=0, description="ABORTs of not-yet-added request ids remembered (newest)"
    )
    inline_step_s: float = Field(
        0.004, ge=0, le=1, description="a step predicted to take at most this long runs on "
        "the engine's event loop instead of a worker thread (for a small model the thread "
        "hop costs more than the forward); 0: always a thread"
    )
    burst_step_s: float = Field(
        0.02, ge=0, le=60, description="in a sync run on Ray the engine may use every core "
        "(nothing else computes while it generates): a step runs on them when the step "
        "before it took at least this long, else on the thread plan's count"
    )

    @model_validator(mode="after")
    def _slots(self) -> TorchEngineOptions:
        if self.kv_slots is not None and self.kv_slots < self.max_running:
            raise ValueError(
                f"kv_slots ({self.kv_slots}) must be at least max_running ({self.max_running})"
            )
        return self

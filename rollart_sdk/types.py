"""Plain data that crosses plane boundaries (and Ray process boundaries).

Everything here is a dataclass of built-in types so it pickles cheaply through Ray and
imports nothing heavy. Tensors appear only inside :class:`WeightBucket`, typed as ``Any``
so that the core never imports torch.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Literal

FinishReason = Literal["stop", "length", "abort"]


@dataclass
class SamplingParams:
    """How one generation request samples. ``top_k=0`` and ``top_p=1.0`` mean "off"."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 64
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None
    # Restrict sampling to these ids (an environment's action vocabulary); None = all.
    allowed_token_ids: list[int] | None = None
    # Report log-probs of the raw distribution (temperature 1, no allowed-ids mask) instead
    # of the sampled policy's: for scoring (a judge forcing a token through
    # allowed_token_ids reads log p(token)), never for trajectories that are trained.
    raw_logprobs: bool = False


@dataclass
class GenerationRequest:
    """One turn of one trajectory, token in: the full context so far as ids."""

    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    tag: str = "default"  # task tag: routes the request to its hardware (hw_mapping)
    trajectory_id: str = ""  # keeps a trajectory on the worker holding its prefix


@dataclass
class GenerationResult:
    """Token out: exactly what the engine sampled, with the behaviour policy's numbers."""

    request_id: str
    token_ids: list[int]
    logprobs: list[float]  # log p(token) under the policy version that produced it
    versions: list[int]  # policy version of each generated token
    finish_reason: FinishReason
    recomputed: int = 0  # times this request's KV cache was rebuilt after a weight update
    worker: str = ""  # which engine worker served it (filled by the data plane)
    # Prefill-decode disaggregation: why the prefill worker's K/V hand-off failed ("" when
    # it arrived or there was none; the decode worker then computed the prompt itself),
    # and whether the prefill worker's process is gone (the LLMProxy takes it out).
    handoff_error: str = ""
    handoff_worker_died: bool = False
    # Multi-turn KV reuse: tokens of this context (prompt + generated) whose K/V the engine
    # kept for the trajectory's next turn (0: none). With PD the LLMProxy passes it to the
    # next turn's prefill, which then hands over only the K/V the decode worker lacks.
    kv_kept: int = 0


@dataclass
class WeightBucket:
    """A named, size-bounded slice of a model's weights for one policy version."""

    version: int
    index: int  # position in the version's bucket list
    tensors: dict[str, Any]  # name -> torch.Tensor (CPU, contiguous)
    checksum: str = ""  # "xxh3-128:<hex>" over names, dtypes, shapes and bytes; see weights.checksum

    @property
    def nbytes(self) -> int:
        return sum(int(t.numel()) * int(t.element_size()) for t in self.tensors.values())


@dataclass
class BucketRef:
    """Where one bucket of a published version lives (transport-specific ``handle``)."""

    index: int
    names: list[str]
    nbytes: int
    checksum: str
    handle: Any = None  # e.g. a Ray ObjectRef, a Mooncake key, a NCCL broadcast slot


@dataclass
class WeightManifest:
    """What a trainer published for one version; engines fetch by it."""

    version: int
    transport: str
    buckets: list[BucketRef]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buckets)


@dataclass
class WeightUpdateReport:
    """Timing of one weight update on one engine worker (seconds)."""

    version: int
    transfer_s: float  # time spent receiving buckets, background part included
    exposed_s: float  # time generation was blocked (the swap at the suspend point)
    nbytes: int
    recomputed_requests: int = 0
    direct: bool = False  # received by the engine's own workers (rollart_sdk.weights.direct)


@dataclass
class Turn:
    """One (observation, action) exchange of a trajectory, as tokens."""

    obs_ids: list[int]  # tokens added by the environment/template this turn (not trained)
    action_ids: list[int]  # tokens the engine produced (trained)
    logprobs: list[float]
    versions: list[int]
    action_text: str = ""
    env_reward: float = 0.0
    # The env's verdict on the action (its step's info["invalid_action"]); None: it gave
    # none. Aggregated per task as invalid_action/<tag> in metrics.jsonl.
    invalid_action: bool | None = None


@dataclass
class Trajectory:
    """One environment episode from reset to done, token in / token out."""

    trajectory_id: str
    tag: str
    group_id: str
    start_version: int
    turns: list[Turn] = field(default_factory=list)
    # Earlier token sequences of the same episode, each trained as its own sample with the
    # trajectory's reward and advantage: an agent episode whose history the agent (or the
    # chat template) rewrote starts a new segment (rollart_sdk.gateway.episode); ``turns``
    # is the last one. Empty for env episodes.
    earlier_segments: list[list[Turn]] = field(default_factory=list)
    env_return: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)  # last env info (e.g. ground truth)
    reward: float | None = None
    dropped: str | None = None  # reason, when the trajectory will not be trained on
    # The policy its tokens were sampled from (rollart_sdk.algorithms.policy): the task's
    # sampling temperature and action vocabulary; the trainer recomputes the same one.
    temperature: float = 1.0
    allowed_token_ids: list[int] | None = None
    engine: str = ""  # the engine worker that served its first turn (mismatch per engine)
    timings: list[tuple[str, float, float]] = field(default_factory=list)  # (span, t0, t1)

    def __setstate__(self, state: dict[str, Any]) -> None:
        # A checkpoint's carried trajectories pickled before a field was added: its default.
        for f in fields(self):
            if f.name not in state:
                state[f.name] = f.default_factory() if f.default_factory is not MISSING \
                    else f.default
        self.__dict__.update(state)

    @property
    def all_turns(self) -> list[Turn]:
        """Every turn of every segment (the earlier ones first)."""
        return [t for seg in self.earlier_segments for t in seg] + self.turns

    @property
    def generated_tokens(self) -> int:
        """Tokens the engines produced for this trajectory (its rollout work)."""
        return sum(len(t.action_ids) for t in self.all_turns)

    @property
    def versions(self) -> set[int]:
        """Policy versions its tokens come from (more than one: it spanned an update)."""
        return {v for t in self.all_turns for v in t.versions}

    def to_samples(self) -> list[TrainSample]:
        """What the trainer gets: one sample per segment, the last segment first."""
        return [self.to_sample(k) for k in range(len(self.earlier_segments) + 1)]

    def to_sample(self, segment: int = 0) -> TrainSample:
        """Segment ``segment`` flattened: 0 is ``turns``, ``k`` > 0 is
        ``earlier_segments[k - 1]``."""
        turns = self.turns if segment == 0 else self.earlier_segments[segment - 1]
        ids: list[int] = []
        mask: list[int] = []
        lps: list[float] = []
        vers: list[int] = []
        for t in turns:
            ids += t.obs_ids
            mask += [0] * len(t.obs_ids)
            lps += [0.0] * len(t.obs_ids)
            vers += [-1] * len(t.obs_ids)
            ids += t.action_ids
            mask += [1] * len(t.action_ids)
            lps += list(t.logprobs)
            vers += list(t.versions)
        return TrainSample(
            input_ids=ids,
            loss_mask=mask,
            behaviour_logprobs=lps,
            token_versions=vers,
            reward=float(self.reward if self.reward is not None else 0.0),
            group_id=self.group_id,
            tag=self.tag,
            start_version=self.start_version,
            temperature=self.temperature,
            allowed_token_ids=self.allowed_token_ids,
            engine=self.engine,
            trajectory_id=self.trajectory_id,
            segment=segment,
        )


@dataclass
class TrainSample:
    """One trajectory flattened for the trainer. All lists have the same length.

    ``loss_mask`` is 1 on tokens the policy produced; ``behaviour_logprobs`` and
    ``token_versions`` are meaningful only there. ``advantage`` is filled by the trainer
    from ``reward`` and ``group_id`` (GRPO) unless the caller already set it.

    ``temperature`` and ``allowed_token_ids`` say which policy the tokens were sampled
    from, ``softmax(mask(logits) / temperature)`` (:mod:`rollart_sdk.algorithms.policy`);
    the behaviour log-probs are of that policy, and trainers recompute the same one on
    every trained token (the defaults: the raw logits).

    ``segment`` > 0 marks an earlier segment of trajectory ``trajectory_id`` (an agent
    episode whose history was rewritten, :attr:`Trajectory.earlier_segments`): it takes
    the advantage of that trajectory's segment 0, and only segment 0 counts in its group's
    statistics (a trajectory is one member of its group however many segments it has).
    """

    input_ids: list[int]
    loss_mask: list[int]
    behaviour_logprobs: list[float]
    token_versions: list[int]
    reward: float
    group_id: str
    tag: str = "default"
    start_version: int = 0
    advantage: float | None = None
    temperature: float = 1.0
    allowed_token_ids: list[int] | None = None
    engine: str = ""  # engine worker that sampled it: train/mismatch_* per engine
    trajectory_id: str = ""
    segment: int = 0


@dataclass
class RewardRequest:
    """What a reward backend scores: one finished trajectory, as text and numbers.

    - ``trajectory_id``: unique per trajectory; the result must carry it back;
    - ``tag``: the task's ``tasks[].tag``;
    - ``prompt``: the env's first observation (from ``reset``), before any chat template;
    - ``responses``: the model's decoded reply of each turn, in order (one per ``step``);
      the observations after the first are not included: put what the reward needs into
      ``info``;
    - ``env_return``: the sum of the rewards the env's ``step`` returned over the episode
      (what reward ``rule`` mode ``env_return`` gives);
    - ``terminated``: the last ``step`` returned ``terminated=True`` (solved or failed),
      False when the episode was truncated (the env's own limit, ``tasks[].max_turns`` or
      ``tasks[].max_context_tokens``);
    - ``info``: a copy of the ``info`` dict of the **last** ``step`` (of ``reset`` when no
      step ran), not merged over steps: an env reports episode-level facts (``success``,
      ``answer``, a score) in every step's info, or at least in the final one. The control
      plane adds ``truncated_reason`` (``"max_turns"`` or ``"max_context_tokens"``) when
      it, not the env, ended the episode.
    """

    trajectory_id: str
    tag: str
    prompt: str  # first observation
    responses: list[str]  # action text of each turn
    env_return: float  # sum of the env's step rewards
    terminated: bool
    info: dict[str, Any] = field(default_factory=dict)  # the last step's info


@dataclass
class RewardResult:
    """A reward backend's answer: ``reward`` (a finite float: what GRPO/PPO train on;
    anything else drops the trajectory with ``reward_invalid``) for the request's
    ``trajectory_id``, and ``details``, a JSON-serialisable dict explaining it (logged
    with each sampled trajectory in ``samples.jsonl``, shown by ``rollart samples``)."""

    trajectory_id: str
    reward: float
    details: dict[str, Any] = field(default_factory=dict)

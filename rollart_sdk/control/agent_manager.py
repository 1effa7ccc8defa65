"""AgentManager: an EnvManager whose environment is an agent program.

The episode's life is the EnvManager's (reset on the env host, one terminal step, the
reward backend, abort), but the turns come from the agent: ``reset`` draws the task, the
gateway opens an episode for the trajectory, and the single ``step`` runs the agent with
the episode's base URL and token (on the env host, like any env step, with
``tasks[].step_timeout_s`` as the whole agent's time). Each of the agent's requests is a
turn the gateway sends through :meth:`generate` - the LLMProxy, with the trajectory's id
(prefix reuse on its engine) and its ABORT path: an abort ends the pending request with
an HTTP 410 the agent's ``openai`` client raises, and the trajectory is dropped with
the reason like any other.

What is trained: every segment of the episode, each as its own sample
(:mod:`rollart_sdk.gateway.episode`; ``Trajectory.earlier_segments``), so every model call;
after a request with ``n > 1``, the last segment only (branches share turns).
"""

from __future__ import annotations

import json
from typing import Any

from rollart_sdk.control.env_manager import _BACKSTOP_S, EnvManager, _env_reason, bounded
from rollart_sdk.gateway.episode import EpisodeRecord, for_template, takes_string_arguments
from rollart_sdk.gateway.server import EpisodeEnded, Gateway
from rollart_sdk.gateway.tools import tool_parser
from rollart_sdk.types import GenerationRequest, GenerationResult, RewardRequest, SamplingParams


class AgentManager(EnvManager):
    """Runs agent episodes through the run's :class:`Gateway` (``task.gateway``)."""

    @property
    def gateway(self) -> Gateway:
        gw: Gateway = self.task.gateway
        return gw

    def _template(self) -> str | None:
        """The chat template's text (``tool_parser: auto`` reads its tool-call format)."""
        template = getattr(self.chat, "template", None) or getattr(self.chat.tok,
                                                                    "chat_template", None)
        return template if isinstance(template, str) else None

    def _record(self) -> EpisodeRecord:
        tok = self.chat.tok
        fmt = self.chat
        kwargs = dict(getattr(fmt, "template_kwargs", {}) or {})
        if getattr(fmt, "template", None) is not None:
            kwargs["chat_template"] = fmt.template

        strings = takes_string_arguments(self._template())

        def render(messages: list[dict[str, Any]], tools: list[Any] | None,
                   generation: bool = True, template_kwargs: dict[str, Any] | None = None
                   ) -> str:
            extra = {"tools": tools} if tools else {}
            return str(tok.apply_chat_template(for_template(messages, strings), tokenize=False,
                                               add_generation_prompt=generation,
                                               **{**kwargs, **(template_kwargs or {})},
                                               **extra))

        return EpisodeRecord(render,
                             lambda text: list(tok(text, add_special_tokens=False)["input_ids"]),
                             lambda ids: str(tok.decode(ids, skip_special_tokens=False)),
                             lambda messages, tools, **kw: render(messages, tools, False, **kw))

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerationResult:
        """One of the agent's turns, through the LLMProxy; :class:`EpisodeEnded` when the
        trajectory was aborted (before or during it) or the generation failed."""
        traj = self.traj
        if self._abort_reason:
            raise EpisodeEnded(f"aborted:{self._abort_reason}")
        n = len(self._turn_results)
        request = GenerationRequest(request_id=f"{traj.trajectory_id}/t{n}",
                                    prompt_ids=list(prompt_ids), sampling=sampling,
                                    tag=traj.tag, trajectory_id=traj.trajectory_id)
        result = await self._generate(request)
        if result is None:  # traj.dropped says why
            raise EpisodeEnded(traj.dropped or "generate_failed")
        if result.finish_reason == "abort" or self._abort_reason:
            self._abort_reason = self._abort_reason or "engine"
            raise EpisodeEnded(f"aborted:{self._abort_reason}")
        self._turn_results.append(result)
        traj.engine = traj.engine or result.worker
        return result

    async def _rollout(self) -> None:
        traj, cfg = self.traj, self.task.config
        self._turn_results: list[GenerationResult] = []
        if self.barrier is not None:
            # Batched interaction cannot hold an agent's turns in lockstep (the agent, not
            # this manager, decides when it calls): it leaves the wave at once.
            self.barrier.leave(self.env_id)
        first = await self._reset()
        if first is None or not await self._wait_for_weights():
            return
        task_text, info = first
        traj.info = info
        gw = self.gateway
        await gw.start()
        sampling = self.task.sampling(self.sample_seed)
        ep = gw.open(traj.trajectory_id, record=self._record(), generate=self.generate,
                     sampling=sampling, max_turns=cfg.max_turns,
                     max_context_tokens=cfg.max_context_tokens,
                     stop_ids={self.chat.eos_id} if self.chat.eos_id is not None else set(),
                     decode_text=self.chat.decode,
                     tool_parser=tool_parser(self.task.tool_parser, self._template()),
                     strict_sampling=not self.task.evaluation)
        handle = json.dumps({"base_url": ep.base_url, "api_key": ep.token,
                             "model": gw.model_name})
        try:
            step = await self._timed(
                "agent", self.env_host.step(self.env_id, handle, cfg.step_timeout_s),
                cfg.step_timeout_s + _BACKSTOP_S, self.env.name)
        except Exception as exc:  # noqa: BLE001 - the agent's failure ends only this episode
            if not (self._abort_reason or traj.dropped):
                traj.dropped = _env_reason("step", exc, cfg.step_timeout_s)
            return
        finally:
            why = traj.dropped or (f"aborted:{self._abort_reason}" if self._abort_reason
                                   else "finished")
            gw.close(ep.episode_id, why)
            self._note(ep)
        if self._abort_reason or traj.dropped:
            return
        self._finish(ep, task_text, step)

    def _note(self, ep: Any) -> None:
        info = self.traj.info
        info["agent_segments"] = len(ep.record.segments)
        info["agent_requests"] = ep.requests
        info.update({f"gateway_{k}": v for k, v in ep.counts.items()})

    def _finish(self, ep: Any, task_text: str, step: Any) -> None:
        traj = self.traj
        answer, reward, terminated, truncated, info = step
        notes = {k: v for k, v in traj.info.items() if k.startswith(("agent_", "gateway_"))}
        traj.info = {**(info if isinstance(info, dict) else {}), **notes}
        trained, guessed = ep.record.trained(str(answer))
        if trained is None:
            traj.dropped = "no_turns: the agent made no model call"
            return
        if guessed:  # the last request had n > 1 and the answer is none of its choices
            traj.info["agent_branch_guessed"] = 1
        traj.turns = list(trained.turns)
        traj.earlier_segments = ep.record.earlier(trained)
        untrained = ep.record.untrained(trained)
        if untrained:  # choices of an n > 1 request the agent did not follow
            traj.info["agent_branches_untrained"] = untrained
        traj.env_return = float(reward)
        traj.terminated, traj.truncated = bool(terminated), bool(truncated)
        self._reward_request = RewardRequest(
            trajectory_id=traj.trajectory_id, tag=traj.tag, prompt=task_text,
            responses=[bounded(str(answer), 100_000)], env_return=traj.env_return,
            terminated=traj.terminated, info=dict(traj.info))

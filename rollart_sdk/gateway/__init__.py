"""Bring your own agent: an OpenAI-compatible gateway in front of the run's engines.

- :class:`~rollart_sdk.gateway.server.Gateway`: ``/v1/chat/completions``,
  ``/v1/responses``, ``/v1/completions`` and ``/v1/models`` on 127.0.0.1, one base URL and
  bearer token per episode;
- :mod:`~rollart_sdk.gateway.responses_api`: the Responses API as a chat turn;
- :mod:`~rollart_sdk.gateway.episode`: how requests become token-exact trajectories
  (segments when an agent rewrites its history, branches for ``n > 1``);
- :mod:`~rollart_sdk.gateway.params`: a request's sampling fields, mapped or refused;
- :mod:`~rollart_sdk.gateway.tools`: tool-call parsers (hermes, llama3_json, mistral);
- :class:`~rollart_sdk.gateway.agent.AgentEnv`: an agent program as a task's env.

docs/gateway.md is the guide. Nothing here imports the web stack or ``openai`` until used.
"""

from rollart_sdk.gateway.agent import AgentEnv, AgentResult
from rollart_sdk.gateway.episode import EpisodeRecord, GatewayError, Segment
from rollart_sdk.gateway.server import MODEL_NAME, Episode, EpisodeEnded, Gateway

__all__ = ["MODEL_NAME", "AgentEnv", "AgentResult", "Episode", "EpisodeEnded", "EpisodeRecord",
           "Gateway", "GatewayError", "Segment"]

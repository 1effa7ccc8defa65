"""Find which GEM envs run offline here and write ``data/manifest.json``.

``python -m rollart_env_gem.probe --write`` builds every env GEM registers, with sockets
disabled and the Hugging Face hub offline, and runs rollart's ``check_env`` on it (one
episode, a time limit per env). What passes is registered as ``gem/<id>``; what fails is
listed under ``excluded`` with the reason, which ``rollart plugins`` shows. The tests
re-run ``check_env`` on every registered id, so a stale manifest fails CI.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
from importlib.metadata import version
from typing import Any

from rollart_env_gem.factory import LOCAL_MATH, MANIFEST, GemFactory

TIME_LIMIT_S = 60


class _TimeLimit(Exception):
    pass


def _offline() -> None:
    os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"

    def refuse(*_: Any, **__: Any) -> None:
        raise OSError("network disabled while probing")

    socket.socket.connect = refuse  # type: ignore[method-assign]
    socket.create_connection = refuse  # type: ignore[assignment]


def _reason(gem_id: str, spec_kwargs: dict[str, Any], exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, _TimeLimit):
        return f"did not pass check_env within {TIME_LIMIT_S} s (resets too slow or never return)"
    if "NLTK" in text or "nltk" in text:
        return "needs NLTK data ('words' corpus) that nltk.download would fetch; not available offline"
    if "dataset_name" in spec_kwargs or "Hub" in text:
        name = spec_kwargs.get("dataset_name", "?")
        return f"downloads the Hugging Face dataset {name!r}; no hub access (gem/{LOCAL_MATH} ships a set)"
    return f"fails in gem-llm {version('gem-llm')} itself: {text.splitlines()[0][:160]}"


def _facts(gem_id: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    if gem_id.startswith(("rg:", "math:")):
        source = "reasoning-gym task" if gem_id.startswith("rg:") else "GEM math (shipped set)"
        return {"summary": f"GEM {source} {gem_id.split(':', 1)[1]}: one question, "
                           "answer in \\boxed{}", "turns": 1,
                "character": "single-turn, decode-heavy (reason, then a boxed answer)"}
    turns = kwargs.get("max_turns")
    game = gem_id.split(":", 1)[1]
    return {"summary": f"GEM game {game}: multi-turn, moves in \\boxed{{}}",
            "turns": turns if turns is not None else "varies per reset",
            "character": "multi-turn, prefill-heavy (the whole history is re-read each turn)"}


def probe(ids: list[str] | None = None) -> dict[str, Any]:
    from rollart_sdk.testing.env import check_env

    _offline()
    from rollart_env_gem.env import _quiet_import_gem

    _quiet_import_gem()
    from gem.envs.registration import ENV_REGISTRY

    specs = {k: dict(v.kwargs) for k, v in ENV_REGISTRY.items()}
    specs[LOCAL_MATH] = {}
    registered: dict[str, Any] = {}
    excluded: dict[str, str] = {}
    signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(_TimeLimit()))
    for gem_id in ids or list(specs):
        t0 = time.monotonic()
        signal.alarm(TIME_LIMIT_S)
        try:
            check_env(GemFactory(gem_id), seed=0, episodes=1)
            signal.alarm(0)
            registered[gem_id] = _facts(gem_id, specs[gem_id])
            status = "ok"
        except BaseException as exc:
            signal.alarm(0)
            if isinstance(exc, KeyboardInterrupt):
                raise
            excluded[gem_id] = _reason(gem_id, specs[gem_id], exc)
            status = excluded[gem_id]
        print(f"{gem_id}: {time.monotonic() - t0:.1f}s {status}", file=sys.stderr, flush=True)
    return {"gem_llm": version("gem-llm"), "registered": registered, "excluded": excluded}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rollart_env_gem.probe")
    p.add_argument("--write", action="store_true", help=f"write {MANIFEST}")
    p.add_argument("ids", nargs="*", help="probe only these GEM ids")
    args = p.parse_args(argv)
    result = probe(args.ids or None)
    text = json.dumps(result, indent=1, sort_keys=True) + "\n"
    if args.write:
        MANIFEST.write_text(text)
        print(f"{len(result['registered'])} registered, {len(result['excluded'])} excluded -> "
              f"{MANIFEST}", file=sys.stderr)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""rollart-env-gem: check_env on every registered GEM id, and what is excluded is truly broken."""

from __future__ import annotations

import json
import threading
from importlib.metadata import version

import pytest
import rollart_env_gem.plugin as plugin
from rollart_env_gem import GemFactory, load_manifest
from rollart_env_gem.env import BOXED_HINT, GemTextEnv
from rollart_env_gem.mathdata import DATA as MATH_DATA
from rollart_env_gem.mathdata import generate as generate_math

from rollart_sdk.errors import UnknownBackendError
from rollart_sdk.testing.env import check_env

MANIFEST = load_manifest()
REGISTERED = sorted(MANIFEST["registered"])


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """No network, as on the machines this runs on: a download attempt fails at once."""
    import socket

    def refuse(*_a, **_k):
        raise OSError("network disabled in tests")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.mark.parametrize("gem_id", REGISTERED)
def test_every_registered_id_passes_check_env(gem_id):
    check_env(GemFactory(gem_id), seed=0, episodes=1)


def test_the_manifest_is_for_the_installed_gem_and_covers_it():
    from gem.envs.registration import ENV_REGISTRY

    assert MANIFEST["gem_llm"] == version("gem-llm") == "0.1.0"
    known = set(ENV_REGISTRY) | {"math:local"}
    assert set(MANIFEST["registered"]) | set(MANIFEST["excluded"]) == known
    assert not set(MANIFEST["registered"]) & set(MANIFEST["excluded"])
    games = [i for i in REGISTERED if i.startswith("game:")]
    tasks = [i for i in REGISTERED if i.startswith("rg:")]
    assert len(games) >= 20 and len(tasks) >= 100 and "math:local" in REGISTERED


@pytest.mark.parametrize(("gem_id", "error", "match", "reason"), [
    ("game:Wordle-v0-easy", LookupError, "words", "NLTK"),
    ("game:Hangman-v0-easy", LookupError, "words", "NLTK"),
    ("math:GSM8K", OSError, "GSM-8k", "Hugging Face dataset"),
    ("game:Crosswords-v0-random", ValueError, "No words found", "gem-llm 0.1.0 itself"),
])
def test_excluded_ids_really_fail_offline(gem_id, error, match, reason):
    # Each fails for the reason the manifest gives (not for any error at all: a typo in
    # GemFactory would raise too).
    assert reason in MANIFEST["excluded"][gem_id]
    with pytest.raises(error, match=match):
        env = GemFactory(gem_id)()
        env.reset(seed=0)
        env.step("\\boxed{1}")


def test_registration_says_why_the_others_are_missing(register_plugin):
    ps = register_plugin(plugin, name="rollart-env-gem")
    names = ps.registry.names("env")
    assert {f"gem/{i}" for i in REGISTERED} <= set(names)
    desc = ps.registry.get("env", "gem/game:GuessTheNumber-v0-easy")
    assert desc.traits["turns"] == 4 and "multi-turn" in desc.traits["character"]
    assert ps.registry.get("env", "gem/rg:basic_arithmetic").traits["turns"] == 1
    with pytest.raises(UnknownBackendError, match="NLTK"):
        ps.registry.get("env", "gem/game:Wordle-v0-easy")
    record = ps.records["rollart-env-gem"]
    assert "NLTK" in record.unavailable["env:gem/game:Hangman-v0-hard"]
    assert "Hugging Face dataset" in record.unavailable["env:gem/math:GSM8K"]


def test_kwargs_are_checked_against_what_gem_registered():
    env = GemFactory("game:GuessTheNumber-v0-easy")(kwargs={"max_turns": 2})
    obs, _ = env.reset(seed=1)
    assert "within 2 turns" in obs
    with pytest.raises(ValueError, match="unknown kwargs.*max_number"):
        GemFactory("game:GuessTheNumber-v0-easy")(kwargs={"max_numbr": 3})


def test_guess_the_number_plays_to_success_with_boxed_answers():
    env = GemTextEnv("game:GuessTheNumber-v0-easy")
    obs, info = env.reset(seed=5)
    assert "\\boxed" in obs and info["success"] is False
    lo, hi = 1, 10
    for _ in range(4):
        guess = (lo + hi) // 2
        obs, reward, term, trunc, info = env.step(f"My guess is \\boxed{{{guess}}}")
        if term:
            break
        assert obs.endswith("Enter your next guess.")  # GEM's suffix is appended
        if "higher" in obs:
            lo = guess + 1
        else:
            hi = guess - 1
    assert term and reward == 1.0 and info["success"]
    with pytest.raises(RuntimeError, match="reset"):
        env.step("\\boxed{3}")


def test_reasoning_gym_task_scores_the_boxed_answer():
    env = GemTextEnv("rg:basic_arithmetic")
    obs, _ = env.reset(seed=3)
    assert obs.endswith(BOXED_HINT)
    answer = env.env.data["answer"]  # reasoning-gym's own ground truth
    _, reward, term, _, info = env.step(f"so the result is \\boxed{{{answer}}}")
    assert term and reward == 1.0 and info["success"]
    env.reset(seed=3)
    _, reward, *_ = env.step("\\boxed{not a number}")
    assert reward < 1.0


def test_math_on_the_shipped_dataset_grades_offline():
    rows = [json.loads(line) for line in MATH_DATA.read_text().splitlines()]
    assert rows == generate_math()
    env = GemTextEnv("math:local")
    try:
        obs, _ = env.reset(seed=0)
        answer = next(r["answer"] for r in rows if r["problem"] in obs)
        _, reward, term, _, info = env.step(f"The answer is \\boxed{{{answer}}}.")
        assert term and reward == 1.0 and info["success"] and info["correct"]
        env.reset(seed=0)
        assert env.step("\\boxed{-12345}")[1] == 0.0
    finally:
        env.close()


def test_dataset_path_is_for_math_local_only(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"problem": "What is 2 + 2?", "answer": "4"}) + "\n")
    env = GemTextEnv("math:local", dataset_path=str(path))
    try:
        assert env.reset(seed=0)[0].startswith("What is 2 + 2?")
        assert env.step("\\boxed{4}")[1] == 1.0
    finally:
        env.close()
    with pytest.raises(ValueError, match="only for gem/math:local"):
        GemTextEnv("rg:basic_arithmetic", dataset_path=str(path))


def test_envs_in_threads_keep_their_own_random_state():
    """GEM draws from the global RNG: interleaved envs must not change each other's games."""
    def episode(env: GemTextEnv, seed: int) -> list[str]:
        out = [env.reset(seed=seed)[0]]
        for g in range(1, 8):
            obs, _, term, trunc, _ = env.step(f"\\boxed{{{g * 6}}}")
            out.append(obs)
            if term or trunc:
                break
        return out

    alone = episode(GemTextEnv("game:Mastermind-v0-easy"), 11)
    envs = [GemTextEnv("game:Mastermind-v0-easy") for _ in range(4)]
    results: dict[int, list[str]] = {}
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, episode(envs[i], 11)))
               for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert all(results[i] == alone for i in range(4))


@pytest.mark.timeout(60)
def test_close_returns_when_the_grading_pool_does_not_terminate():
    """multiprocessing's ``Pool.terminate`` can block (CI under load: 300 s in close);
    close is bounded: past its limit the pool's processes are killed and it returns."""
    import multiprocessing
    import threading
    import time

    from rollart_env_gem.env import _terminate

    worker = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(600,),
                                                          daemon=True)
    worker.start()
    stuck = threading.Event()

    class StuckPool:
        _pool = [worker]

        def terminate(self):
            stuck.wait()  # never set: the task-handler join that does not return

        def join(self):
            pass

    _terminate(StuckPool(), timeout_s=1.0)
    worker.join(20)
    assert worker.exitcode is not None and worker.exitcode < 0  # killed, not left running

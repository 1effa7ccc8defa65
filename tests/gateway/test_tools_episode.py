"""Tool-call parsing and the segment rule, on text (no model, no server)."""

from __future__ import annotations

import json

import pytest

from rollart_sdk.gateway.episode import Choice, EpisodeRecord, GatewayError, normalize_messages
from rollart_sdk.gateway.tools import parse_hermes, tool_parser
from rollart_sdk.types import GenerationResult


def test_hermes_calls_are_parsed_and_malformed_ones_stay_text() -> None:
    text = 'Let me add. <tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    content, calls, bad = parse_hermes(text)
    assert content == "Let me add." and bad == 0 and calls is not None
    assert calls[0]["function"]["name"] == "add"
    assert json.loads(calls[0]["function"]["arguments"]) == {"a": 2, "b": 3}
    broken = "<tool_call>{not json}</tool_call>"
    assert parse_hermes(broken) == (broken, None, 1)
    with pytest.raises(ValueError, match="hermes"):
        tool_parser("llama9")


def test_bad_messages_say_which_and_why() -> None:
    with pytest.raises(GatewayError, match=r"messages\[1\]: needs a role"):
        normalize_messages([{"role": "user", "content": "a"}, {"content": "b"}])
    with pytest.raises(GatewayError, match="text parts"):
        normalize_messages([{"role": "user", "content": [{"type": "image_url"}]}])
    assert normalize_messages([{"role": "developer", "content": None}]) == [
        {"role": "system", "content": ""}]


def _record() -> EpisodeRecord:
    def render(messages, tools):  # a ChatML-like template, one char per token below
        body = "".join(f"<{m['role']}>{m['content']}|" for m in messages)
        return body + "<assistant>"

    return EpisodeRecord(render, lambda t: [ord(c) for c in t],
                         lambda ids: "".join(chr(i) for i in ids))


def _turn(record: EpisodeRecord, messages, reply: str):
    prompt = record.prompt(messages, None)
    ids = [ord(c) for c in reply + "|"]  # the model ends its turn with the template's "|"
    result = GenerationResult("r", ids, [-0.5] * len(ids), [0] * len(ids), "stop")
    record.record(prompt, messages, [Choice(result, {"role": "assistant", "content": reply})])
    return prompt


def test_appended_history_continues_and_a_rewrite_starts_a_segment() -> None:
    rec = _record()
    m1 = [{"role": "user", "content": "hi"}]
    _turn(rec, m1, "yo")
    m2 = [*m1, {"role": "assistant", "content": "yo"}, {"role": "user", "content": "more"}]
    p2 = _turn(rec, m2, "ok")
    assert p2.continues and "".join(map(chr, p2.new_ids)) == "<user>more|<assistant>"
    assert len(rec.segments) == 1 and len(rec.segments[0].turns) == 2
    # The agent edits the model's earlier reply: a new segment from the whole render.
    m3 = [*m1, {"role": "assistant", "content": "YO"}, {"role": "user", "content": "more"}]
    p3 = _turn(rec, m3, "k")
    assert not p3.continues and p3.ids == p3.new_ids
    assert len(rec.segments) == 2


def test_an_agent_task_needs_a_chat_template_and_no_inline_host() -> None:
    from types import SimpleNamespace

    from rollart_sdk.config import TaskConfig
    from rollart_sdk.control.chat import PlainFormat
    from rollart_sdk.job.preflight import _agent_problems

    task = TaskConfig(tag="a", env={"name": "agent"}, env_host="inline")
    fmt = PlainFormat(SimpleNamespace(eos_token_id=0))
    problems = dict(_agent_problems(0, task, fmt))
    assert "chat template" in problems["tasks.0.prompt_format"]
    assert "cannot run inline" in problems["tasks.0.env_host"]


def test_an_episode_ending_on_n_choices_trains_the_branch_holding_the_answer() -> None:
    rec = _record()
    m1 = [{"role": "user", "content": "hi"}]
    prompt = rec.prompt(m1, None)
    choices = []
    for reply in ("a", "b", "c"):
        ids = [ord(ch) for ch in reply + "|"]
        result = GenerationResult("r", ids, [-0.5] * len(ids), [0] * len(ids), "stop")
        choices.append(Choice(result, {"role": "assistant", "content": reply}))
    rec.record(prompt, m1, choices)
    assert len(rec.segments) == 3 and rec.last == [0, 1, 2]
    seg, guessed = rec.trained("b")
    assert seg is rec.segments[1] and not guessed
    seg, guessed = rec.trained("none of them")  # choice 0, flagged as a guess
    assert seg is rec.segments[0] and guessed


def _qwen3_record() -> EpisodeRecord:
    """Qwen 3's own chat template (tests/data/chat_templates), one char per token."""
    from pathlib import Path

    from transformers.utils.chat_template_utils import render_jinja_template

    template = (Path(__file__).resolve().parents[1] / "data" / "chat_templates"
                / "qwen3.jinja").read_text()

    def render(messages, tools):
        out, _ = render_jinja_template([messages], tools=tools, chat_template=template,
                                       add_generation_prompt=True)
        return str(out[0])

    return EpisodeRecord(render, lambda t: [ord(c) for c in t],
                         lambda ids: "".join(chr(i) for i in ids))


def test_qwen3_thinking_turns_are_segments_and_every_segment_is_trained() -> None:
    """Qwen 3's template drops the thinking of assistant turns before the last user
    message, so the history never renders as the model wrote it: each user turn starts a
    segment. Every segment is trained, each as its own sample of the engine's tokens."""
    from rollart_sdk.types import Trajectory

    rec = _qwen3_record()
    messages = [{"role": "user", "content": "2 + 3?"}]
    generated = []
    for i, reply in enumerate(["<think>\nadd them\n</think>\n\n5", "<think>\nx2\n</think>\n\n10",
                               "<think>\nok\n</think>\n\ndone"]):
        prompt = rec.prompt(messages, None)
        assert not prompt.continues  # the thinking is gone from the history
        ids = [ord(c) for c in reply + "<|im_end|>"]
        generated.append(ids)
        result = GenerationResult("r", ids, [-0.5] * len(ids), [0] * len(ids), "stop")
        rec.record(prompt, messages, [Choice(result, {"role": "assistant", "content": reply})])
        messages = [*messages, {"role": "assistant", "content": reply},
                    {"role": "user", "content": f"and then {i}?"}]
    assert len(rec.segments) == 3
    last, guessed = rec.trained("done")
    assert last is rec.segments[2] and not guessed
    traj = Trajectory("t", "agent", "g", 0, turns=list(last.turns), reward=1.0,
                      earlier_segments=rec.earlier(last))
    samples = traj.to_samples()
    assert [s.segment for s in samples] == [0, 1, 2]
    trained = [[i for i, m in zip(s.input_ids, s.loss_mask, strict=True) if m] for s in samples]
    assert trained == [generated[2], generated[0], generated[1]]
    assert traj.generated_tokens == sum(map(len, generated)) and len(traj.all_turns) == 3
    # The last segment's prompt is the whole render, the earlier replies without thinking.
    text = "".join(map(chr, samples[0].input_ids))
    assert "add them" not in text and "<|im_start|>assistant\n5<|im_end|>" in text


def _choices(record: EpisodeRecord, messages, replies):
    """One request with ``len(replies)`` choices (n > 1)."""
    prompt = record.prompt(messages, None)
    choices = []
    for reply in replies:
        ids = [ord(ch) for ch in reply + "|"]
        result = GenerationResult("r", ids, [-0.5] * len(ids), [0] * len(ids), "stop")
        choices.append(Choice(result, {"role": "assistant", "content": reply}))
    return record.record(prompt, messages, choices)


def _trained_text(turn_lists) -> list[str]:
    """The trained (sampled) text of each turn list, as a sample would train it."""
    return ["".join(chr(i) for t in turns for i in t.action_ids) for turns in turn_lists]


def test_a_branched_episode_trains_every_followed_segment_and_counts_the_rest() -> None:
    """A segment before the branch, the branch the agent followed and the one it ended on
    are trained; the choice it did not follow is counted, not trained."""
    rec = _record()
    _turn(rec, [{"role": "user", "content": "hi"}], "yo")  # segment 0
    m = [{"role": "user", "content": "again"}]  # a rewrite: segment 1, two choices
    _choices(rec, m, ["a", "b"])  # choice "a" extends segment 1, "b" is segment 2
    # The agent goes on from "b" (its reply sent back): segment 2 is followed.
    _turn(rec, [*m, {"role": "assistant", "content": "b"}, {"role": "user", "content": "go"}],
          "c")
    _turn(rec, [{"role": "user", "content": "sum up"}], "done")  # a rewrite: segment 3
    last, guessed = rec.trained("done")
    assert last is rec.segments[3] and not guessed
    assert _trained_text(rec.earlier(last)) == ["yo|", "b|c|"]
    assert rec.untrained(last) == 1  # "a"
    # Ending on the branch: the sibling is not trained, the segment before it is.
    rec2 = _record()
    _turn(rec2, [{"role": "user", "content": "hi"}], "yo")
    _choices(rec2, m, ["a", "b"])
    last2, _ = rec2.trained("b")
    assert last2 is rec2.segments[2] and _trained_text(rec2.earlier(last2)) == ["yo|"]
    assert rec2.untrained(last2) == 1
    # Without a branch every segment is trained, nothing counted.
    rec3 = _record()
    _turn(rec3, [{"role": "user", "content": "hi"}], "yo")
    _turn(rec3, m, "a")
    last3, _ = rec3.trained("a")
    assert rec3.earlier(last3) == [rec3.segments[0].turns] and rec3.untrained(last3) == 0


def test_two_followed_branches_train_their_shared_turns_once() -> None:
    """An agent that explores both choices (a tree search): each branch is trained, and
    the turn they share (copied into the second at the branch) is context in the earlier
    sample, never trained twice."""
    from rollart_sdk.types import Trajectory

    rec = _record()
    m1 = [{"role": "user", "content": "hi"}]
    _turn(rec, m1, "yo")
    m2 = [*m1, {"role": "assistant", "content": "yo"}, {"role": "user", "content": "pick"}]
    _choices(rec, m2, ["a", "b"])  # segment 0 = yo, a; segment 1 = yo (shared), b
    for reply, nxt in (("a", "x"), ("b", "y")):  # both followed
        _turn(rec, [*m2, {"role": "assistant", "content": reply},
                    {"role": "user", "content": "on"}], nxt)
    assert len(rec.segments) == 2 and rec.segments[0].turns[0] is rec.segments[1].turns[0]
    last, _ = rec.trained("y")
    assert last is rec.segments[1] and rec.untrained(last) == 0
    earlier = rec.earlier(last)
    assert _trained_text(earlier) == ["a|x|"]
    traj = Trajectory("t", "agent", "g", 0, turns=list(last.turns), reward=1.0,
                      earlier_segments=earlier)
    first, second = traj.to_samples()
    trained = lambda s: "".join(chr(i) for i, k in zip(s.input_ids, s.loss_mask,  # noqa: E731
                                                        strict=True) if k)
    assert trained(first) == "yo|b|y|" and trained(second) == "a|x|"
    # The shared turn is still in the earlier sample's prompt, in its place.
    assert "".join(map(chr, second.input_ids)).startswith("<user>hi|<assistant>yo|<user>pick|")

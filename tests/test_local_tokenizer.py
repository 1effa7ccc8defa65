"""LocalTokenizer: the tiny character tokenizer without transformers, against transformers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rollart_sdk.control.chat import ChatFormat
from rollart_sdk.models import LocalTokenizer, build_tokenizer, is_local_tokenizer, load_tokenizer

TEXTS = ["pos=0,1 goal=3,3 holes=1,1;1,3", "Left", "  two  spaces\tand\nnewline", "Up Down",
         "<eos>inside<|user|>", "ünïcödé → unk", ""]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tok")
    build_tokenizer(["Left", "Down", "Right", "Up"]).save_pretrained(out)
    return out


def test_same_ids_text_and_template_as_transformers(folder: Path) -> None:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    ours = load_tokenizer(folder, light=True)
    assert isinstance(ours, LocalTokenizer)
    assert (ours.eos_token_id, ours.pad_token_id, len(ours)) == (
        hf.eos_token_id, hf.pad_token_id, len(hf))
    for text in TEXTS:
        for special in (True, False):
            assert ours(text, add_special_tokens=special)["input_ids"] == hf(
                text, add_special_tokens=special)["input_ids"], text
        ids = hf(text)["input_ids"] + [hf.eos_token_id]
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(
                ids, skip_special_tokens=skip), text
    chats = [[{"role": "user", "content": "pos=0,0"}],
             [{"role": "system", "content": "play"}, {"role": "user", "content": "a"},
              {"role": "assistant", "content": "Left"}, {"role": "user", "content": "b"}]]
    for messages in chats:
        for gen in (True, False):
            for tokenize in (True, False):
                assert ours.apply_chat_template(messages, tokenize=tokenize,
                                                add_generation_prompt=gen) == \
                    hf.apply_chat_template(messages, tokenize=tokenize, add_generation_prompt=gen)
    # The chat format built on either gives the same prompts and action ids.
    a, b = ChatFormat(ours), ChatFormat(hf)
    assert a.first_prompt("pos=0,0", "sys") == b.first_prompt("pos=0,0", "sys")
    assert a.next_observation("pos=1,0", [7]) == b.next_observation("pos=1,0", [7])
    assert a.action_token_ids(["Left", "Up"]) == b.action_token_ids(["Left", "Up"])


def test_a_template_with_tools_renders_as_in_transformers(folder: Path) -> None:
    """``tojson`` as transformers defines it: keys in order, ``<`` kept (jinja2's own
    filter sorts keys and escapes HTML); the tools of examples/templates/tiny_tools.jinja."""
    from transformers import AutoTokenizer

    template = (Path(__file__).resolve().parents[1] / "examples" / "templates"
                / "tiny_tools.jinja").read_text()
    tools = [{"type": "function", "function": {
        "name": "calculator", "description": "a < b & c > 'd'",
        "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}}]
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "2+3?"},
                {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
                 "function": {"name": "calculator", "arguments": {"x": "2+3"}}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "5"}]
    hf = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    kw = {"tools": tools, "chat_template": template, "add_generation_prompt": True,
          "tokenize": False}
    ours = load_tokenizer(folder, light=True).apply_chat_template(messages, **kw)
    assert ours == hf.apply_chat_template(messages, **kw)
    assert '{"type": "function", "function": {"name": "calculator", "description": "a < b' in ours


def test_only_this_modules_tokenizers_are_loaded_locally(folder: Path, tmp_path: Path) -> None:
    assert is_local_tokenizer(folder)
    other = tmp_path / "other"
    other.mkdir()
    for f in folder.iterdir():
        (other / f.name).write_bytes(f.read_bytes())
    (other / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    assert not is_local_tokenizer(other)  # someone else's template: transformers loads it
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    (other / "chat_template.jinja").write_text((folder / "chat_template.jinja").read_text())
    (other / "tokenizer_config.json").write_text(json.dumps({**cfg, "eos_token": "</s>"}))
    assert not is_local_tokenizer(other)
    assert not isinstance(load_tokenizer(other, light=True), LocalTokenizer)
    assert not isinstance(load_tokenizer(folder), LocalTokenizer)  # asked for transformers


def test_loading_does_not_import_transformers(folder: Path) -> None:
    code = ("import sys; from rollart_sdk.models import load_tokenizer; "
            f"t = load_tokenizer({str(folder)!r}, light=True); t.apply_chat_template([{{'role': 'user', "
            "'content': 'x'}]); print(type(t).__name__, 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    assert out == ["LocalTokenizer", "False"]

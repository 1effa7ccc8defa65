"""Model preparation: tiny random models, GGUF conversion, loading.

Engines and trainers always receive a :class:`~rollart_sdk.config.ModelConfig` whose
``path`` is set: :func:`prepare_model` turns ``tiny`` and ``gguf`` sources into an
ordinary Hugging Face checkpoint folder once, before any worker starts, and caches it by
content so every worker (and every rerun) loads the same bytes.

torch / transformers / tokenizers are imported inside functions only, so importing this
module (e.g. by the CLI) stays cheap.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import string
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollart_sdk.config import ModelConfig, TinyModelConfig
from rollart_sdk.errors import ConfigError, RollartError

if TYPE_CHECKING:  # pragma: no cover - typing only
    from transformers import PreTrainedModel, PreTrainedTokenizerFast

# Bump when the layout of built checkpoints changes, so old cache entries are not reused.
_FORMAT = 1

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")

# Each message is "<|role|>\n<content><eos>\n"; the generation prompt opens the assistant
# turn, so the model's answer ends when it emits <eos> (the engine's default stop token).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<eos>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


def _charset() -> list[str]:
    """Printable ASCII (space included) plus newline and tab, in a fixed order."""
    chars = [c for c in string.printable if c not in "\r\x0b\x0c"]
    return sorted(set(chars), key=chars.index)


def build_tokenizer(extra_tokens: Sequence[str] = ()) -> PreTrainedTokenizerFast:
    """A character-level tokenizer made locally (no hub access).

    Every string in ``extra_tokens`` becomes ONE token (e.g. an environment's action words
    such as ``"Left"``), so an environment's actions can be constrained to single ids.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    specials = [PAD, EOS, UNK, *ROLE_TOKENS]
    vocab: dict[str, int] = {tok: i for i, tok in enumerate(specials)}
    for ch in _charset():
        vocab.setdefault(ch, len(vocab))
    # A BPE model without merges splits any text into single characters.
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK, fuse_unk=False))
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    extras = []
    for word in dict.fromkeys(extra_tokens):  # de-duplicated, order kept
        if not word:
            raise ValueError("extra_tokens must not contain empty strings")
        if word not in vocab:
            extras.append(AddedToken(word, special=False, normalized=False))
    if extras:
        tok.add_tokens(extras)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        eos_token=EOS,
        unk_token=UNK,
        additional_special_tokens=list(ROLE_TOKENS),
        model_max_length=1 << 20,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_shape(tiny: TinyModelConfig) -> dict[str, Any]:
    """The Hugging Face config keys of a tiny model's shape (``build_tiny_checkpoint``'s
    LlamaConfig; ``rollart validate`` checks backends against them before building it)."""
    return {"hidden_size": tiny.hidden_size, "intermediate_size": tiny.intermediate_size,
            "num_hidden_layers": tiny.num_layers, "num_attention_heads": tiny.num_heads,
            "num_key_value_heads": tiny.num_heads,
            "max_position_embeddings": tiny.max_position_embeddings}


def build_tiny_checkpoint(
    tiny: TinyModelConfig, out_dir: str | os.PathLike[str], extra_tokens: Sequence[str] = ()
) -> str:
    """Write a seeded, randomly initialised LlamaForCausalLM plus its tokenizer to ``out_dir``.

    The result loads with ``AutoModelForCausalLM`` / ``AutoTokenizer`` like any checkpoint.
    """
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    if tiny.hidden_size % tiny.num_heads:
        raise ConfigError(
            [("model.tiny.hidden_size", f"{tiny.hidden_size} is not divisible by "
              f"num_heads={tiny.num_heads}; choose sizes with hidden_size % num_heads == 0")]
        )
    tokenizer = build_tokenizer(extra_tokens)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        **tiny_shape(tiny),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    # Seed a private generator state so building a model never disturbs the caller's RNG.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(tiny.seed)
        model = LlamaForCausalLM(config).float().eval()
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


def convert_gguf(gguf_path: str | os.PathLike[str], out_dir: str | os.PathLike[str]) -> str:
    """Dequantise a GGUF file into an fp32 safetensors checkpoint (+ tokenizer) in ``out_dir``.

    Uses transformers' GGUF reader directly (config from the GGUF metadata, tensors
    dequantised into a model built from that config), which avoids needing ``accelerate``.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    src = Path(gguf_path)
    if not src.is_file():
        raise RollartError(
            f"GGUF file not found: {src}. Give an existing file, or "
            "package:<python package>/<file> for a GGUF shipped in an installed package."
        )
    folder, name = str(src.parent), src.name
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(str(src), return_tensors=True, model_to_load=model)["tensors"]
    result = model.load_state_dict(tensors, strict=False)
    missing = [k for k in result.missing_keys if not _is_tied(model, k)]
    if missing or result.unexpected_keys:
        raise RollartError(
            f"GGUF {src} does not match its declared architecture "
            f"{config.model_type!r}: missing {missing[:5]}, unexpected "
            f"{list(result.unexpected_keys)[:5]}. Convert it with llama.cpp's tools instead."
        )
    model.tie_weights()
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


def read_gguf_meta(gguf_path: str | os.PathLike[str]) -> tuple[dict[str, Any], Any]:
    """The config (as a dict) and the tokenizer that :func:`convert_gguf` would write for
    ``gguf_path``, read from the GGUF's metadata alone (nothing dequantised): what
    ``rollart validate`` checks a GGUF model with.

    Parsing the metadata takes about 10 CPU-seconds for SmolLM2's 49k-token vocabulary
    (transformers reads the file once for the config and once for the tokenizer), so the
    result is kept, as ``save_pretrained`` writes it, under :func:`cache_dir` keyed by
    the file's path, size and modification time: a second ``validate`` of the same file
    reads the saved folder (a fraction of a second)."""
    from transformers import AutoConfig, AutoTokenizer

    src = Path(gguf_path)
    st = src.stat()
    key = _digest({"path": str(src.resolve()), "size": st.st_size, "mtime": st.st_mtime_ns})
    kept = cache_dir() / "gguf-meta" / f"{src.stem}-{key}"
    if (kept / "complete").exists():
        try:
            return (AutoConfig.from_pretrained(kept).to_dict(),
                    AutoTokenizer.from_pretrained(kept))
        except (OSError, ValueError):
            shutil.rmtree(kept, ignore_errors=True)  # unreadable: parse the GGUF again
    folder, name = str(src.parent), src.name
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    _keep(kept, config, tokenizer)
    return config.to_dict(), tokenizer


def cache_dir() -> Path:
    """Where the SDK keeps what it can recompute: ``$ROLLART_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/rollart``, else ``~/.cache/rollart``."""
    if os.environ.get("ROLLART_CACHE_DIR"):
        return Path(os.environ["ROLLART_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "rollart"


def _keep(folder: Path, config: Any, tokenizer: Any) -> None:
    """Save config and tokenizer to ``folder`` (atomically: a temporary folder renamed;
    a read-only or full disk only loses the cache)."""
    tmp: Path | None = None
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}-"))
        config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "complete").write_text("")
        os.replace(tmp, folder)
    except OSError:  # another process kept it first, or the disk refused
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _is_tied(model: PreTrainedModel, key: str) -> bool:
    return key == "lm_head.weight" and bool(getattr(model.config, "tie_word_embeddings", False))


def _digest(payload: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def prepare_model(
    model: ModelConfig, cache_dir: str | os.PathLike[str], extra_tokens: Sequence[str] = ()
) -> ModelConfig:
    """Return a ModelConfig with ``path`` set, building or converting at most once.

    - ``path``: returned unchanged;
    - ``tiny``: built under ``cache_dir/tiny-<hash>`` (hash of the tiny config and
      ``extra_tokens``, which become single tokens of its vocabulary);
    - ``gguf``: converted under ``cache_dir/gguf-<name>-<hash>`` (hash of the file's path,
      size and mtime). ``extra_tokens`` are ignored: a pretrained vocabulary is kept.

    Builds go to a temporary folder renamed into place, so a half-written checkpoint is
    never picked up and concurrent callers agree on one result.
    """
    if model.path is not None:
        return model
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    if model.tiny is not None:
        key = _digest({"f": _FORMAT, "tiny": model.tiny.model_dump(), "extra": list(extra_tokens)})
        target = cache / f"tiny-{key}"

        def build(tmp: str) -> None:
            assert model.tiny is not None
            build_tiny_checkpoint(model.tiny, tmp, extra_tokens)

    else:
        src = model.gguf_path()
        if not src.is_file():
            raise ConfigError([("model.gguf", f"file not found: {src}")])
        st = src.stat()
        key = _digest({"f": _FORMAT, "src": str(src.resolve()), "size": st.st_size,
                       "mtime": int(st.st_mtime)})
        target = cache / f"gguf-{src.stem}-{key}"

        def build(tmp: str) -> None:
            convert_gguf(src, tmp)

    if not (target / "config.json").is_file():
        tmp = tempfile.mkdtemp(prefix=f".{target.name}-", dir=cache)
        try:
            build(tmp)
            try:
                os.rename(tmp, target)
            except OSError:
                if not (target / "config.json").is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return model.model_copy(update={"path": str(target), "tiny": None, "gguf": None})


# apply_chat_template keywords of transformers' that are not template variables.
_NOT_VARIABLES = {"return_dict", "return_tensors", "padding", "truncation", "max_length",
                  "continue_final_message", "return_assistant_tokens_mask", "tokenizer_kwargs"}


def _compile_template(source: str) -> Any:
    """A chat template compiled as transformers compiles it: a sandboxed jinja2
    environment with trim_blocks and lstrip_blocks, loop controls, its
    ``raise_exception`` and ``strftime_now`` (Gemma's and Llama 3.2's templates call them)
    and its ``tojson`` (keys in the given order, no HTML escaping: jinja2's own sorts the
    keys and writes ``<`` as ``\\u003c``, so a template that renders ``tools`` with it
    would show the model other text than transformers does)."""
    import json
    from datetime import datetime

    from jinja2.exceptions import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env.globals.update(raise_exception=raise_exception,
                       strftime_now=lambda fmt: datetime.now().strftime(fmt))
    env.filters["tojson"] = tojson
    return env.from_string(source)


class LocalTokenizer:
    """The character tokenizer of :func:`build_tokenizer`, loaded with the ``tokenizers``
    library alone (transformers' tokenizer classes cost about 0.6 s to import).

    It offers what the SDK asks of a tokenizer - ``tok(text, add_special_tokens=...)
    ["input_ids"]``, ``decode``, ``apply_chat_template``, ``eos_token_id``,
    ``pad_token_id``, ``chat_template``, ``len`` - with transformers' results (the tests
    compare them); :func:`load_tokenizer` uses it only for folders this module built."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        from tokenizers import Tokenizer

        folder = Path(path)
        self._tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        cfg = json.loads((folder / "tokenizer_config.json").read_text())
        self.chat_template: str = (folder / "chat_template.jinja").read_text()
        self.eos_token, self.pad_token = cfg["eos_token"], cfg["pad_token"]
        self.eos_token_id = self._tok.token_to_id(self.eos_token)
        self.pad_token_id = self._tok.token_to_id(self.pad_token)
        self._templates: dict[str, Any] = {}

    def __len__(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": self.encode(text, add_special_tokens)}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def convert_tokens_to_ids(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def apply_chat_template(self, messages: list[dict[str, str]], tokenize: bool = True,
                            add_generation_prompt: bool = False,
                            chat_template: str | None = None, **kwargs: Any) -> Any:
        """The template (``chat_template`` instead of the tokenizer's when given; the
        other keywords are template variables) rendered as transformers renders it (a
        sandboxed jinja2 environment, trim_blocks and lstrip_blocks); with ``tokenize``,
        transformers 5's dict of ``input_ids`` and ``attention_mask``."""
        source = self.chat_template if chat_template is None else chat_template
        template = self._templates.get(source)
        if template is None:  # compiled once per template text (a task's override too)
            template = self._templates[source] = _compile_template(source)
        text = template.render(**{k: v for k, v in kwargs.items() if k not in _NOT_VARIABLES},
                               messages=messages, add_generation_prompt=add_generation_prompt,
                               eos_token=self.eos_token, pad_token=self.pad_token)
        if not tokenize:
            return text
        ids = self(text, add_special_tokens=False)["input_ids"]
        return {"input_ids": ids, "attention_mask": [1] * len(ids)}


def is_local_tokenizer(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` holds a tokenizer :func:`build_tokenizer` made (its files, its
    special tokens, its chat template)."""
    folder = Path(path)
    try:
        cfg = json.loads((folder / "tokenizer_config.json").read_text())
        template = (folder / "chat_template.jinja").read_text()
    except (OSError, ValueError):
        return False
    return (template == CHAT_TEMPLATE and cfg.get("eos_token") == EOS
            and cfg.get("pad_token") == PAD and cfg.get("unk_token") == UNK
            and (folder / "tokenizer.json").is_file())


def load_tokenizer(path: str | os.PathLike[str], light: bool = False) -> Any:
    """The tokenizer saved beside a checkpoint: transformers' AutoTokenizer (local files
    only), or with ``light`` a :class:`LocalTokenizer` when this module built it (what the
    pipeline asks of a tokenizer, without importing transformers)."""
    if light and is_local_tokenizer(path):
        return LocalTokenizer(path)
    folder = Path(path)
    how = ("a checkpoint folder needs its tokenizer beside config.json: tokenizer.json "
           "(or tokenizer.model, or vocab.json and merges.txt) and tokenizer_config.json; "
           "copy them from the model it was trained from")
    if folder.is_dir() and not any(_tokenizer_file(f.name) for f in folder.iterdir()):
        raise ConfigError([("model.path", f"{folder} has no tokenizer ({', '.join(TOKENIZER_FILES)}"
                            f" all missing): {how}")])
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as exc:  # transformers' words for a tokenizer it cannot build
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError([("model.path", f"the tokenizer in {folder} could not be loaded "
                            f"({type(exc).__name__}: {first}): {how}")]) from exc


# The usual tokenizer files; a folder with none of them, and no other file named like a
# tokenizer or a vocabulary (``*.model``, ``*.tiktoken``, ``vocab.txt``...), has none.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model",
                   "tiktoken.model")


def _tokenizer_file(name: str) -> bool:
    return (name in TOKENIZER_FILES or "vocab" in name or name.endswith((".model", ".tiktoken"))
            or (name.startswith("tokenizer") and name != "tokenizer_config.json"))


def load_causal_lm(path: str | os.PathLike[str], dtype: str = "float32",
                   implementation: str = "transformers") -> Any:
    """A causal LM in eval mode with the given dtype name ("float32", "bfloat16", ...).

    ``implementation`` (the torch engine and trainer pass ``model.implementation``):
    ``transformers`` (the default here: a ``PreTrainedModel``, ``generate`` and all) loads
    ``AutoModelForCausalLM``; ``auto`` the SDK's own plain-torch model
    (:mod:`rollart_sdk.nn.llama`: the same parameters and forward, no transformers import)
    when it covers the checkpoint, else transformers'; ``native`` requires the former (an
    error says why not)."""
    import torch

    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}; use float32, bfloat16 or float16")
    if implementation not in ("auto", "native", "transformers"):
        raise ValueError(f"unknown model implementation {implementation!r}; use auto, native "
                         "or transformers")
    if implementation != "transformers":
        from rollart_sdk.nn import llama

        native = llama.load(path, torch_dtype)
        if native is not None:
            return native
        if implementation == "native":
            try:
                cfg = json.loads((Path(path) / "config.json").read_text())
                why = llama.unsupported_reason(cfg) or (
                    "its weights are not one model.safetensors with the expected tensors")
            except (OSError, ValueError) as exc:
                why = f"config.json unreadable ({exc})"
            raise ValueError(
                f"model.implementation: native cannot load {path}: {why}. Use "
                "model.implementation: auto (falls back to transformers) or transformers."
            )
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype, local_files_only=True)
    return model.eval()


def hf_checkpoint_path(model: ModelConfig | str, backend: str, hint: str = "") -> str:
    """The Hugging Face checkpoint folder a trainer backend loads (``model.path``, or the
    path itself); a clear error when there is none or it is not a checkpoint folder."""
    path = model if isinstance(model, str) else model.path
    if path is None:
        raise ValueError(
            f"trainer {backend!r} needs model.path (a Hugging Face checkpoint folder); the "
            f"pipeline converts model.gguf / model.tiny to one before starting trainers{hint}"
        )
    if not (Path(path) / "config.json").is_file():
        raise FileNotFoundError(
            f"model.path {path!r} is not a Hugging Face checkpoint folder (no config.json)"
        )
    return str(path)


def resolve_device(spec: str, rank: int) -> Any:
    """The torch device of data-parallel ``rank`` for a ``device`` option: ``auto`` (this
    rank's GPU when CUDA is there, else the CPU), ``cuda`` (this rank's GPU: ranks on one
    node must not all land on GPU 0), ``cuda:N``, ``cpu``."""
    import torch

    if spec == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", rank % torch.cuda.device_count())
        return torch.device("cpu")
    dev = torch.device(spec)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"trainer option device={spec!r} but CUDA is not available here; use cpu")
    if dev.type == "cuda" and dev.index is None:
        return torch.device("cuda", rank % torch.cuda.device_count())
    return dev

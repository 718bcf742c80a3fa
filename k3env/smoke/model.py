"""The small model a smoke run serves: written here, read by the image's own engine.

A byte-level vocabulary (256 byte tokens, then the special tokens) written twice with the same
ids: as a Hugging Face ``tokenizer.json`` (vLLM's tokenizer) and as a ``tiktoken.model``
(Dynamo's Rust frontend for tiktoken model types such as ``kimi_k3``), so a request tokenized by
the frontend decodes the same in the engine. The weights are never written: the engine is
started with ``--load-format dummy`` (random weights of the configured shape).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path

from .. import files, jsontext

# The markers each parser family reads in generated text, as dedicated special tokens (the
# parsers' own docstrings name them: Kimi K3's XTML channels, Hermes' tool_call tags).
PARSER_TOKENS: dict[str, tuple[str, ...]] = {
    "kimi_k3": ("<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"),
    "hermes": ("<tool_call>", "</tool_call>"),
}
BOS, EOS = "<|bos|>", "<|eos|>"
LLAMA_DIR = "llama"

# What the generation prompt carries when a request turns thinking off
# (``chat_template_kwargs: {"thinking": false}``): an empty, closed think channel, so the
# reasoning parser sees reasoning end in the prompt and the rest is content (Kimi K3's XTML).
NO_THINK: dict[str, str] = {"kimi_k3": "<|open|>think<|sep|><|close|>think<|sep|>"}

# Random weights never close a channel: a logit bias toward these tokens stands in for a
# trained model's choice while the tool parser's grammar keeps the output well formed (Kimi K3:
# close each channel; end the call index).
STEER: dict[str, dict[str, float]] = {"kimi_k3": {"<|close|>": 100.0, '"': 50.0}}


def thinks(reasoning_parser: str) -> bool:
    """Whether a request can turn this parser's thinking off in the chat template."""
    return reasoning_parser in NO_THINK


# The smallest Llama the CPU attention backend takes (head sizes 32, 64, ...): ready in ~40 s.
LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "num_hidden_layers": 2,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}

# Tools listed, then the conversation: enough for a parser to see a request with tools.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}{% for t in tools %}{{ t | tojson }}\n{% endfor %}{% endif %}"
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] or '' }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {{ no_think }}{% endif %}"
)


# Model types whose config nests the language model's fields (their config classes compute
# the top-level ones): Kimi K3 is a vision-language config over a Kimi Linear text config.
# (the key of the nested config, the architecture the declared config names).
NESTED = {"kimi_k3": ("text_config", "KimiK3ForConditionalGeneration")}


def _declared(model_type: str, llama: dict[str, object]) -> dict[str, object]:
    """config.json: the tokenizer's declared type, in the shape its config class loads."""
    if model_type == "llama":
        return llama
    ids = {k: llama[k] for k in ("bos_token_id", "eos_token_id")}
    if model_type in NESTED:
        text = {k: v for k, v in llama.items() if k not in ("architectures", "model_type")}
        key, architecture = NESTED[model_type]
        return {"model_type": model_type, "architectures": [architecture], key: text, **ids}
    return dict(llama, model_type=model_type)


def dump(value: object) -> str:
    return jsontext.dumps(value, indent=1) + "\n"


def _template(parsers: tuple[str, ...]) -> str:
    prefix = next((NO_THINK[p] for p in parsers if p in NO_THINK), "")
    if not prefix:
        return CHAT_TEMPLATE.replace("{{ no_think }}", "")
    off = "{% if thinking is defined and not thinking %}" + prefix + "{% endif %}"
    return CHAT_TEMPLATE.replace("{{ no_think }}", off)


@dataclass(frozen=True)
class SmokeModel:
    """What was written: the directory, the tokenizer's declared ``model_type`` and the
    special tokens, in id order after the 256 byte tokens."""

    path: Path
    model_type: str
    special: tuple[str, ...]
    engine_config: str | None = None  # the directory (below path) of the engine's config

    def token_id(self, text: str) -> int:
        """The id of a special token, or of a one-byte token."""
        if text in self.special:
            return 256 + self.special.index(text)
        data = text.encode()
        if len(data) != 1:
            raise ValueError(f"{text!r} is neither a special token nor one byte")
        return data[0]


def _byte_chars() -> list[str]:
    """GPT-2's byte-to-unicode table: the printable character byte-level BPE uses per byte."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def _added(i: int, text: str) -> dict[str, object]:
    # Every field of Hugging Face's AddedToken: older Dynamo parsers require them all.
    return {
        "id": i,
        "content": text,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": True,
    }


def write_model(directory: Path, *, model_type: str, parsers: tuple[str, ...]) -> SmokeModel:
    """Write the model files into ``directory`` (created; must not exist) and say what they
    hold. ``model_type`` is the tokenizer's declared type (config.json), ``parsers`` the
    tool-call and reasoning parser names whose marker tokens the vocabulary must carry."""
    special: list[str] = [BOS, EOS]
    for name in parsers:
        for token in PARSER_TOKENS.get(name, ()):
            if token not in special:
                special.append(token)
    ids = {text: 256 + i for i, text in enumerate(special)}
    vocab = len(_byte_chars()) + len(special)
    llama = dict(LLAMA, vocab_size=vocab, bos_token_id=ids[BOS], eos_token_id=ids[EOS])
    # config.json declares the tokenizer's type (what Dynamo's frontend reads); when that is
    # not Llama, the engine reads the Llama layers from llama/config.json (--hf-config-path).
    config = _declared(model_type, llama)
    tokenizer: dict[str, object] = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [_added(i, text) for text, i in ids.items()],
        "normalizer": None,
        "pre_tokenizer": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": True,
            "use_regex": False,
        },
        "post_processor": None,
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": True,
            "use_regex": False,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {c: b for b, c in enumerate(_byte_chars())},
            "merges": [],
        },
    }
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "model_max_length": LLAMA["max_position_embeddings"],
        "added_tokens_decoder": {
            str(i): {k: v for k, v in _added(i, text).items() if k != "id"}
            for text, i in ids.items()
        },
        "chat_template": _template(parsers),
    }
    tiktoken = "".join(f"{base64.b64encode(bytes([b])).decode()} {b}\n" for b in range(256))
    directory.mkdir(parents=True)
    files.write_atomic(directory / "config.json", dump(config))
    files.write_atomic(directory / "tokenizer_config.json", dump(tokenizer_config))
    generation = {"bos_token_id": ids[BOS], "eos_token_id": ids[EOS]}
    files.write_atomic(directory / "generation_config.json", dump(generation))
    engine_config = None
    if model_type == "llama":
        files.write_atomic(directory / "tokenizer.json", dump(tokenizer))
    else:
        # A tiktoken type: the frontend finds only tiktoken.model beside config.json (with a
        # tokenizer.json it would load that instead); the engine reads the same vocabulary
        # as tokenizer.json, with the Llama layers, from llama/.
        files.write_atomic(directory / "tiktoken.model", tiktoken)
        engine = directory / LLAMA_DIR
        engine.mkdir()
        files.write_atomic(engine / "config.json", dump(llama))
        files.write_atomic(engine / "tokenizer.json", dump(tokenizer))
        files.write_atomic(engine / "tokenizer_config.json", dump(tokenizer_config))
        files.write_atomic(engine / "generation_config.json", dump(generation))
        engine_config = LLAMA_DIR
    return SmokeModel(directory, model_type, tuple(special), engine_config)

"""Tokenizer (Hugging Face `tokenizer.json`), chat template and incremental detokenization."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import CheckpointError, read_checkpoint_json

DEFAULT_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


class Tokenizer:
    """Wraps a `tokenizers.Tokenizer` with the special tokens and chat template of a checkpoint."""

    def __init__(self, directory: Path, eos_token_ids: tuple[int, ...] = ()) -> None:
        from tokenizers import Tokenizer as RustTokenizer

        path = directory / "tokenizer.json"
        if not path.is_file():
            raise CheckpointError(
                f"{path}: not found; the checkpoint directory needs a tokenizer.json "
                "(save one with `tokenizer.save_pretrained(dir)` in transformers)"
            )
        try:
            self._tokenizer = RustTokenizer.from_file(str(path))
        except Exception as error:  # the Rust loader raises a plain Exception
            raise CheckpointError(f"{path}: cannot be read as a tokenizer: {error}") from error
        config = _read_json(directory / "tokenizer_config.json")
        # transformers saves the template to its own file since 4.43; that file wins, as there.
        template_file = directory / "chat_template.jinja"
        file_template = template_file.read_text() if template_file.is_file() else None
        self.chat_template: str = file_template or _chat_template(config) or DEFAULT_CHAT_TEMPLATE
        self.bos_token: str = _token_text(config.get("bos_token")) or ""
        self.eos_token: str = _token_text(config.get("eos_token")) or ""
        eos_ids = set(eos_token_ids)
        if self.eos_token:
            eos_id = self._tokenizer.token_to_id(self.eos_token)
            if eos_id is not None:
                eos_ids.add(eos_id)
        self.eos_token_ids = frozenset(eos_ids)
        self._compiled_template: Any = None

    @property
    def vocab_size(self) -> int:
        return int(self._tokenizer.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, token_ids: list[int]) -> str:
        return str(self._tokenizer.decode(token_ids, skip_special_tokens=True))

    def apply_chat_template(self, messages: list[dict[str, str]]) -> str:
        if self._compiled_template is None:
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            self._compiled_template = environment.from_string(self.chat_template)
        return str(
            self._compiled_template.render(
                messages=messages,
                add_generation_prompt=True,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        )

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        # The template already carries the BOS token; adding specials again would double it.
        return self.encode(self.apply_chat_template(messages), add_special_tokens=False)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = read_checkpoint_json(path)
    return data if isinstance(data, dict) else {}


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        content = value.get("content")
        return str(content) if content is not None else None
    return None if value is None else str(value)


def _chat_template(config: dict[str, Any]) -> str | None:
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: take the default one
        for entry in template:
            if isinstance(entry, dict) and entry.get("name") == "default":
                return str(entry.get("template"))
        return None
    return None if template is None else str(template)


@dataclass
class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas without splitting a character.

    Decodes a short window of recent tokens twice (with and without the newest ones) and
    emits the difference only once it no longer ends in U+FFFD, the mark of an incomplete
    UTF-8 sequence, so a multi-byte character split across tokens is emitted whole.
    """

    tokenizer: Tokenizer
    prefix_offset: int = 0
    read_offset: int = 0

    @classmethod
    def for_prompt(cls, tokenizer: Tokenizer, prompt_ids: list[int]) -> IncrementalDetokenizer:
        # A few prompt tokens of context so tokenizers that merge leading spaces decode right.
        read_offset = len(prompt_ids)
        return cls(tokenizer, prefix_offset=max(read_offset - 4, 0), read_offset=read_offset)

    def step(self, all_ids: list[int], final: bool = False) -> str:
        prefix_text = self.tokenizer.decode(all_ids[self.prefix_offset : self.read_offset])
        new_text = self.tokenizer.decode(all_ids[self.prefix_offset :])
        if len(new_text) > len(prefix_text) and (final or not new_text.endswith("\ufffd")):
            self.prefix_offset = self.read_offset
            self.read_offset = len(all_ids)
            return new_text[len(prefix_text) :]
        return ""

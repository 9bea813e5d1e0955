"""A character-level tokenizer for models built inline from a tiny config (no hub download).

Vocabulary (fixed, 100 ids):

- ``0`` ``<pad>``, ``1`` ``<eos>``, ``2`` ``<unk>``,
- ``3..97`` printable ASCII (``chr(32)`` .. ``chr(126)``), ``98`` newline,
- ``99`` ``<bos>``: always reserved so ``vocab_size`` does not change when a bos token is enabled.

Any other character encodes to ``<unk>``. It subclasses ``transformers.PreTrainedTokenizer``, so
padding, truncation, ``return_tensors``, ``batch_decode``, ``apply_chat_template`` and
``save_pretrained``/``from_pretrained`` behave as for any Hugging Face tokenizer. Padding is on
the left by default, which is what generation prompts need.

Saved directories load without rlhfctl. ``save_pretrained`` writes, beside ``chat_template.jinja``:

- ``tokenizer.json``: the same vocabulary as a ``tokenizers`` library tokenizer (:meth:`CharTokenizer.to_tokenizers`):
  every character its own piece, each piece looked up whole (so one unknown character is one ``<unk>``), no
  bos/eos added, decoding joins the pieces with nothing between them;
- ``tokenizer_config.json`` naming ``tokenizer_class: PreTrainedTokenizerFast``, so plain
  ``AutoTokenizer.from_pretrained`` builds the fast tokenizer from ``tokenizer.json`` (ids equal to this class's
  for every string), with the pad/eos/unk (and bos) tokens, left padding and the chat template; and
  ``rlhfctl_tokenizer: CharTokenizer`` (:data:`MARKER_KEY`), by which rlhfctl's loader recognises the
  vocabulary and builds this class again (:func:`is_char_tokenizer_config`, the one place for that rule; a
  directory saved before, with ``tokenizer_class: CharTokenizer`` and no ``tokenizer.json``, still counts).

The ``tokenizer.json`` vocabulary spells each character in the GPT-2 byte-level alphabet (space is ``Ġ``,
newline ``Ċ``; printable ASCII is itself) and the pre-tokenizer maps text to that alphabet. That is for
transformers 5, which for a ``qwen2`` config builds ``Qwen2Tokenizer`` whatever ``tokenizer_class`` says: it
keeps only the vocabulary of ``tokenizer.json`` and runs its own byte-level pipeline over it, which gives this
vocabulary's ids for printable ASCII and newlines too, but drops a character outside the vocabulary (a tab, a
non-ASCII letter) where this class gives ``<unk>``. The generic fast tokenizer transformers builds otherwise
(the other inline model types tried: llama, mistral, qwen3, gpt2, gemma, ...; and every type under
transformers 4) matches this class for every string.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from tokenizers import AddedToken as BackendAddedToken
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizer

__all__ = [
    "CharTokenizer",
    "DEFAULT_CHAT_TEMPLATE",
    "MARKER_KEY",
    "PORTABLE_TOKENIZER_CLASS",
    "TOKENIZER_CLASS_NAME",
    "is_char_tokenizer_config",
    "is_char_tokenizer_dir",
]

TOKENIZER_CLASS_NAME = "CharTokenizer"
"""This class's name: :data:`MARKER_KEY`'s value, and the ``tokenizer_class`` of directories saved before the marker."""

MARKER_KEY = "rlhfctl_tokenizer"
"""The ``tokenizer_config.json`` key that says "rlhfctl's character vocabulary" (value :data:`TOKENIZER_CLASS_NAME`)."""

PORTABLE_TOKENIZER_CLASS = "PreTrainedTokenizerFast"
"""The ``tokenizer_class`` saved: transformers without rlhfctl builds a fast tokenizer from ``tokenizer.json``."""

TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
TOKENIZER_FILE = "tokenizer.json"

_LEADING_SPECIALS = ("<pad>", "<eos>", "<unk>")
_CHARACTERS = tuple(chr(code) for code in range(32, 127)) + ("\n",)
_TRAILING_SPECIALS = ("<bos>",)
_VOCAB = _LEADING_SPECIALS + _CHARACTERS + _TRAILING_SPECIALS

DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
"""Renders ``role: content`` lines, then ``assistant: `` when a generation prompt is asked for."""


def is_char_tokenizer_config(config: Mapping[str, Any]) -> bool:
    """Whether a ``tokenizer_config.json``'s contents are this vocabulary's: the marker, or the old class name."""
    return TOKENIZER_CLASS_NAME in (config.get(MARKER_KEY), config.get("tokenizer_class"))


def is_char_tokenizer_dir(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` holds a tokenizer this class saved (see :func:`is_char_tokenizer_config`)."""
    config_file = os.path.join(os.fspath(path), TOKENIZER_CONFIG_FILE)
    if not os.path.isfile(config_file):
        return False
    try:
        with open(config_file, encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and is_char_tokenizer_config(config)


def _byte_level() -> pre_tokenizers.ByteLevel:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)


def _byte_level_spelling(token: str) -> str:
    """A one-character token as the byte-level pre-tokenizer spells it (``' '`` -> ``'Ġ'``); others as they are."""
    if len(token) != 1:
        return token
    ((piece, _),) = _byte_level().pre_tokenize_str(token)
    return piece


class CharTokenizer(PreTrainedTokenizer):
    """One token per character, so inline random models need no tokenizer files to start."""

    vocab_files_names: dict[str, str] = {}
    model_input_names = ["input_ids", "attention_mask"]
    padding_side = "left"

    def __init__(
        self,
        pad_token: str = "<pad>",
        eos_token: str = "<eos>",
        unk_token: str = "<unk>",
        bos_token: str | None = None,
        chat_template: str | None = None,
        padding_side: str = "left",
        **kwargs: Any,
    ) -> None:
        # The vocabulary must exist before the base class initialises: it calls get_vocab().
        self._token_to_id = {token: index for index, token in enumerate(_VOCAB)}
        self._id_to_token = dict(enumerate(_VOCAB))
        kwargs.setdefault("clean_up_tokenization_spaces", False)
        # Saved keys that are not this class's arguments: the class transformers loads, the marker, tokenizer.json.
        for key in ("tokenizer_class", MARKER_KEY, "tokenizer_file", "backend"):
            kwargs.pop(key, None)
        super().__init__(
            pad_token=pad_token,
            eos_token=eos_token,
            unk_token=unk_token,
            bos_token=bos_token,
            chat_template=chat_template if chat_template is not None else DEFAULT_CHAT_TEMPLATE,
            padding_side=padding_side,
            **kwargs,
        )

    @property
    def vocab_size(self) -> int:
        """Size of the fixed vocabulary (tokens added later with ``add_tokens`` come on top)."""
        return len(self._token_to_id)

    def get_vocab(self) -> dict[str, int]:
        """Token -> id for the fixed vocabulary plus any added tokens."""
        vocab = dict(self._token_to_id)
        vocab.update(getattr(self, "_added_tokens_encoder", {}))
        return vocab

    def _tokenize(self, text: str, **kwargs: Any) -> list[str]:
        return list(text)

    def _convert_token_to_id(self, token: str) -> int:
        return self._token_to_id.get(token, self._token_to_id["<unk>"])

    def _convert_id_to_token(self, index: int) -> str:
        return self._id_to_token.get(int(index), "<unk>")

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        """Characters join back with no separator."""
        return "".join(tokens)

    def build_inputs_with_special_tokens(
        self, token_ids_0: list[int], token_ids_1: list[int] | None = None
    ) -> list[int]:
        """Add no bos/eos around encoded text: prompts carry exactly the characters given."""
        return list(token_ids_0) + (list(token_ids_1) if token_ids_1 is not None else [])

    def get_special_tokens_mask(
        self,
        token_ids_0: list[int],
        token_ids_1: list[int] | None = None,
        already_has_special_tokens: bool = False,
    ) -> list[int]:
        """Mark the special ids in already-built inputs; nothing is added, so otherwise all zeros."""
        if already_has_special_tokens:
            special = set(self.all_special_ids)
            ids = list(token_ids_0) + list(token_ids_1 or [])
            return [1 if token in special else 0 for token in ids]
        return [0] * (len(token_ids_0) + len(token_ids_1 or []))

    def create_token_type_ids_from_sequences(
        self, token_ids_0: list[int], token_ids_1: list[int] | None = None
    ) -> list[int]:
        """All zeros: the models this feeds have no segment embeddings."""
        return [0] * (len(token_ids_0) + len(token_ids_1 or []))

    def to_tokenizers(self) -> Tokenizer:
        """This tokenizer as a ``tokenizers`` library tokenizer: the same ids for every string, decoding back exactly.

        A word-level model over the vocabulary (spelled in the byte-level alphabet, see the module docstring),
        unknown pieces to ``<unk>``; the pre-tokenizer isolates every character, then spells it byte-level (a
        character outside the vocabulary stays one piece, so one ``<unk>``); the byte-level decoder joins the
        pieces with nothing between them. The added tokens (pad/eos/unk, bos when set, any added later) keep
        their ids and are matched in text before splitting, as here.
        """
        vocab = {_byte_level_spelling(token): index for index, token in self._id_to_token.items()}
        if len(vocab) != len(self._id_to_token):
            raise ValueError("two tokens of the character vocabulary have the same byte-level spelling")
        backend = Tokenizer(models.WordLevel(vocab, unk_token=self.unk_token))
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated"), _byte_level()]
        )
        backend.decoder = decoders.ByteLevel()
        for index, token in sorted(self.added_tokens_decoder.items()):
            backend.add_tokens([BackendAddedToken(
                token.content, single_word=token.single_word, lstrip=token.lstrip, rstrip=token.rstrip,
                normalized=token.normalized, special=token.special,
            )])
            if backend.token_to_id(token.content) != index:
                raise ValueError(
                    f"added token {token.content!r} has id {index}, which tokenizer.json cannot give it (added "
                    "tokens must follow the vocabulary in id order)"
                )
        return backend

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str, ...]:
        """Write ``tokenizer.json`` (:meth:`to_tokenizers`), which transformers without rlhfctl loads."""
        path = os.path.join(save_directory, (filename_prefix + "-" if filename_prefix else "") + TOKENIZER_FILE)
        self.to_tokenizers().save(path)
        return (path,)

    def save_pretrained(
        self,
        save_directory: str | os.PathLike[str],
        legacy_format: bool | None = None,
        filename_prefix: str | None = None,
        push_to_hub: bool = False,
        **kwargs: Any,
    ) -> tuple[str, ...]:
        """Save as transformers does, with ``tokenizer.json``, then make ``tokenizer_config.json`` name the fast class.

        The config keeps everything transformers wrote (special tokens, ``padding_side``, the added tokens)
        and gains :data:`MARKER_KEY` and the chat template (also in ``chat_template.jinja``, which transformers
        reads first). To upload, ``push_to_hub(repo_id)``: it saves through this method.
        """
        if push_to_hub:
            raise ValueError("save_pretrained(push_to_hub=True) is not supported here; call push_to_hub(repo_id)")
        files = super().save_pretrained(
            save_directory, legacy_format=legacy_format, filename_prefix=filename_prefix, **kwargs
        )
        config_file = os.path.join(
            os.fspath(save_directory), (filename_prefix + "-" if filename_prefix else "") + TOKENIZER_CONFIG_FILE
        )
        with open(config_file, encoding="utf-8") as handle:
            config = json.load(handle)
        config["tokenizer_class"] = PORTABLE_TOKENIZER_CLASS
        config[MARKER_KEY] = TOKENIZER_CLASS_NAME
        config.pop("backend", None)  # transformers 5 writes "custom" for a python tokenizer; the fast one is not
        config["clean_up_tokenization_spaces"] = False
        if isinstance(self.chat_template, str):
            config["chat_template"] = self.chat_template
        with open(config_file, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(config, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
        return tuple(file for file in files if os.path.isfile(file))

"""A character-level tokenizer for models built inline from a tiny config (no hub download).

Vocabulary (fixed, 100 ids):

- ``0`` ``<pad>``, ``1`` ``<eos>``, ``2`` ``<unk>``,
- ``3..97`` printable ASCII (``chr(32)`` .. ``chr(126)``), ``98`` newline,
- ``99`` ``<bos>``: always reserved so ``vocab_size`` does not change when a bos token is enabled.

Any other character encodes to ``<unk>``. It subclasses ``transformers.PreTrainedTokenizer``, so
padding, truncation, ``return_tensors``, ``batch_decode``, ``apply_chat_template`` and
``save_pretrained``/``from_pretrained`` behave as for any Hugging Face tokenizer. Padding is on
the left by default, which is what generation prompts need.
"""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedTokenizer

__all__ = ["CharTokenizer", "DEFAULT_CHAT_TEMPLATE", "TOKENIZER_CLASS_NAME"]

TOKENIZER_CLASS_NAME = "CharTokenizer"
"""The ``tokenizer_class`` written to ``tokenizer_config.json``; loaders look for it."""

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
        kwargs.pop("tokenizer_class", None)
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

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str, ...]:
        """Nothing to write: the vocabulary is fixed by the code, ``tokenizer_config.json`` is enough."""
        return ()

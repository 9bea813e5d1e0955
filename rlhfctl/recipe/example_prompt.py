"""The example validate shows: the first training prompt as the policy will see it, and whether the tokenizer keeps it.

With the actor's tokenizer on disk (``roles.actor.model.tokenizer_path``, else ``roles.actor.model.path``:
a local directory or a hub id in the local Hugging Face cache; validate never downloads) and data files
(``data.train_files``), the first record of the first file goes through the run's own code:
:func:`rlhfctl.models.loading.load_tokenizer`, then :class:`rlhfctl.data.prompts.PromptDataset` (the chat
template by :func:`rlhfctl.data.verl_layout.uses_chat_template`: a list of messages under null, every prompt
under true). The findings:

- warning, the class: ``tokenizer_config.json`` names a ``tokenizer_class`` that the tokenizer
  ``AutoTokenizer`` returned is not (another class can tokenize very differently from the one saved);
- warning, the round trip: ``decode(encode(text))`` does not give the text back (the special tokens a
  template writes decode to themselves, and are compared without them too), or the prompt shrank to
  more than :data:`MAX_CHARS_PER_TOKEN` characters a token;
- warning, no tokenizer: the directory holds only a config.json (enough for the memory plan);
- errors the run would stop on at this record: a chat template asked for and missing, a prompt that is
  not text, or longer than ``data.max_prompt_length`` with ``data.overlong: error``.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import asdict, dataclass
from typing import Any

from rlhfctl.agents.tool_registry import chat_tools
from rlhfctl.data.verl_layout import prompt_messages
from rlhfctl.recipe.errors import Issue, error, warning
from rlhfctl.recipe.specs import Recipe

__all__ = ["MAX_CHARS_PER_TOKEN", "ExamplePrompt", "example_prompt", "has_tokenizer_files", "local_directory"]

MAX_CHARS_PER_TOKEN = 12
"""More characters a token than this (on a prompt of :data:`_MIN_CHARS` or more) means the tokenizer merges text."""
_MIN_CHARS = 32
_SHOWN_PIECES = 16
_SHOWN_DIFFERENCE = 24


@dataclass(frozen=True)
class ExamplePrompt:
    """The first training prompt, rendered and tokenized as the run will, and how the tokenizer keeps it."""

    key: str
    """Where the tokenizer comes from: ``roles.actor.model.tokenizer_path`` or ``roles.actor.model.path``."""
    tokenizer_class: str
    source: str
    """``data.train_files[0]`` and its file name."""
    chat_template: bool
    """Whether this prompt was rendered with the chat template."""
    text: str
    """What the model sees: the record's prompt, after the chat template when applied."""
    tokens: int
    pieces: tuple[str, ...]
    """The first tokens as the tokenizer names them."""
    max_prompt_length: int
    overlong: str
    round_trip: str | None
    """None when ``decode(encode(text)) == text``, else where and how they differ."""

    @property
    def characters(self) -> int:
        return len(self.text)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly view (``round_trip_ok`` beside the difference)."""
        return {**asdict(self), "pieces": list(self.pieces), "characters": self.characters,
                "round_trip_ok": self.round_trip is None}


def example_prompt(recipe: Recipe) -> tuple[ExamplePrompt | None, list[Issue]]:
    """The example and its findings; (None, []) when the recipe has no local tokenizer or no data files to show."""
    actor = recipe.section_of("actor") if recipe.stage is None else None
    files = recipe.data.train_files or []
    if actor is None or actor.model is None or not files:
        return None, []
    model = dict(actor.model)
    field = "tokenizer_path" if model.get("tokenizer_path") else "path"
    directory = local_directory(str(model[field])) if model.get(field) else None
    if directory is None:
        return None, []  # not set, or not here: check_models and preflight report a path that cannot load
    key, name = f"roles.actor.model.{field}", str(files[0])
    if not has_tokenizer_files(directory):
        return None, [warning(key, (
            f"{key}: {directory} holds no tokenizer files (tokenizer_config.json, tokenizer.json, vocab files), "
            "so no example prompt is shown; that is enough for the memory plan, but a run loading its tokenizer "
            "from there gets whatever AutoTokenizer builds without them (with transformers 5, an empty one): "
            "add the tokenizer, or set roles.actor.model.tokenizer_path"
        ))]
    tokenizer, problem = _tokenizer(model, field, directory, key)
    if problem is not None:
        return None, [problem]
    rendered, problems = _render(recipe, tokenizer, name)
    if rendered is None:
        return None, problems
    text, ids, chat = rendered
    decoded = tokenizer.decode(ids, skip_special_tokens=False)
    example = ExamplePrompt(
        key=key, tokenizer_class=type(tokenizer).__name__, source=f"data.train_files[0] ({name})",
        chat_template=chat, text=text, tokens=len(ids),
        pieces=tuple(str(piece) for piece in tokenizer.convert_ids_to_tokens(ids[:_SHOWN_PIECES])),
        max_prompt_length=int(recipe.data.max_prompt_length), overlong=str(recipe.data.overlong),
        round_trip=_difference(text, decoded, tokenizer),
    )
    return example, _findings(example, tokenizer, directory, ids) + _length(example, name)


def local_directory(source: str) -> str | None:
    """``source`` as a local directory: itself, or a hub id's snapshot in the local cache; None when not here."""
    path = os.path.expanduser(source)
    if os.path.isdir(path):
        return path
    if source.startswith((".", "/", "~")) or source.count("/") != 1:
        return None
    try:
        from huggingface_hub import snapshot_download  # huggingface_hub: only for a hub model id

        return str(snapshot_download(source, local_files_only=True))
    except Exception:  # noqa: BLE001 - not a valid id, or not in the cache: nothing here to read
        return None


def has_tokenizer_files(directory: str) -> bool:
    """The directory holds a saved tokenizer (its config, a tokenizers file or a vocabulary), not only a config.json."""
    try:
        names = os.listdir(directory)
    except OSError:
        return False
    return any(name.startswith("tokenizer") or name.startswith(("vocab.", "merges.")) or name.endswith(".model")
               for name in names)


def _tokenizer(model: dict[str, Any], field: str, directory: str, key: str) -> tuple[Any, Issue | None]:
    """The run's tokenizer (load_tokenizer on the local directory), or the error the run would stop on."""
    from rlhfctl.models.loading import ModelConfigError, load_tokenizer  # transformers: only when a tokenizer loads

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # path and config both set: check_models' business
            return load_tokenizer({**model, field: directory},
                                  trust_remote_code=bool(model.get("trust_remote_code"))), None
    except (ModelConfigError, OSError, ValueError) as failure:
        first = str(failure).strip().splitlines()[0] if str(failure).strip() else type(failure).__name__
        return None, error(key, f"{key}: the tokenizer in {directory} does not load: {first}")


def _render(recipe: Recipe, tokenizer: Any, name: str) -> tuple[tuple[str, list[int], bool] | None, list[Issue]]:
    """(text, ids, chat template applied) of the first record as PromptDataset renders and encodes it (unbounded),
    or the run's error."""
    # the data package pulls in torch: only when a prompt renders
    from rlhfctl.data import DataConfigError, DataFileError, PromptDataset, load_records

    try:
        records = load_records(name, limit=1)
    except (DataFileError, OSError):
        return None, []  # check_data and preflight's sample report the file
    if not records:
        return None, []
    chat = recipe.data.apply_chat_template
    try:
        prompt_messages(records[0].get(str(recipe.data.prompt_key)), chat, name, 1)
    except (AttributeError, DataFileError):
        return None, []  # preflight's sample reports a record without a prompt or with one the setting cannot use
    try:
        dataset = PromptDataset(records, prompt_key=str(recipe.data.prompt_key), tokenizer=tokenizer,
                                apply_chat_template=chat, source=name, chat_tools=chat_tools(recipe.rollout.multi_turn))
    except DataConfigError as failure:
        return None, [error("data.apply_chat_template", f"data.apply_chat_template: {failure}")]
    except DataFileError as failure:
        return None, [error("data.train_files[0]", f"data.train_files[0]: {failure}")]
    row = dataset[0]
    return (row.prompt_text, list(row.prompt_ids), row.messages is not None), []


def _difference(text: str, decoded: str, tokenizer: Any) -> str | None:
    """None when the round trip gives the text back (also once the special tokens are left out of both)."""
    if decoded == text:
        return None
    specials = sorted({str(token) for token in getattr(tokenizer, "all_special_tokens", []) if token}, key=len,
                      reverse=True)
    bare_text, bare_decoded = text, decoded
    for token in specials:
        bare_text, bare_decoded = bare_text.replace(token, ""), bare_decoded.replace(token, "")
    if bare_text == bare_decoded:
        return None
    at = next((i for i, (a, b) in enumerate(zip(text, decoded)) if a != b), min(len(text), len(decoded)))
    end = at + _SHOWN_DIFFERENCE
    return (f"from character {at}: the text has {text[at:end]!r}, decoded {decoded[at:end]!r} "
            f"({len(text)} characters in, {len(decoded)} out)")


def _saved_class(directory: str) -> str | None:
    """The class ``tokenizer_config.json`` names; CharTokenizer for its directories (they name the fast class for
    transformers without rlhfctl, and rlhfctl's loader builds CharTokenizer from them)."""
    from rlhfctl.models.tokenizer import TOKENIZER_CLASS_NAME, is_char_tokenizer_config

    try:
        with open(os.path.join(directory, "tokenizer_config.json"), encoding="utf-8") as handle:
            config = json.load(handle)
        if is_char_tokenizer_config(config):
            return TOKENIZER_CLASS_NAME
        saved = config.get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        return None
    return str(saved) if saved else None


def _is_saved_class(tokenizer: Any, saved: str) -> bool:
    """The loaded tokenizer is the saved class, its fast twin, or an alias of it (transformers' own names); a
    subclass is not (a model's tokenizer class on the generic one saved can rebuild its pre-tokenizer)."""
    if type(tokenizer).__name__ in (saved, saved + "Fast", saved.removesuffix("Fast")):
        return True
    import transformers  # heavy: only for a tokenizer saved as another class

    for name in (saved, saved + "Fast", saved.removesuffix("Fast")):
        try:
            cls = getattr(transformers, name, None)
        except Exception:  # noqa: BLE001 - a lazy module that fails to import: not this class
            cls = None
        if isinstance(cls, type) and type(tokenizer) is cls:
            return True
    return False


def _findings(example: ExamplePrompt, tokenizer: Any, directory: str, ids: list[int]) -> list[Issue]:
    """Warnings: the class loaded is not the class saved; the round trip changes the text; the prompt shrank."""
    key, loaded, found = example.key, example.tokenizer_class, []
    saved = _saved_class(directory)
    classes = ""
    if saved and not _is_saved_class(tokenizer, saved):
        classes = f" (tokenizer_config.json saved {saved!r}, AutoTokenizer loaded {loaded!r})"
        found.append(warning(key, (
            f"{key}: {directory}/tokenizer_config.json saved tokenizer_class {saved!r} but AutoTokenizer loaded "
            f"{loaded!r}, which may tokenize differently, and the run tokenizes with it (see the example prompt); "
            "if it is not the class meant, name that one in tokenizer_config.json, or keep the tokenizer in a "
            "directory without the model's config.json (roles.actor.model.tokenizer_path), where AutoTokenizer "
            "does not pick a class by model_type"
        )))
    if example.round_trip is not None:
        unk = getattr(tokenizer, "unk_token_id", None)
        unknown = sum(1 for token in ids if unk is not None and token == unk)
        lost = f"; {unknown} of its {len(ids)} tokens are {tokenizer.unk_token!r}" if unknown else ""
        found.append(warning(key, (
            f"{key}: the {loaded} tokenizer drops or changes characters of the first prompt of "
            f"{example.source}: decode(encode(text)) differs {example.round_trip}{lost}{classes}; the model "
            "would train on other text than the data's"
        )))
    if example.characters >= _MIN_CHARS and example.characters > MAX_CHARS_PER_TOKEN * example.tokens:
        found.append(warning(key, (
            f"{key}: the {loaded} tokenizer shrinks the first prompt of {example.source} to {example.tokens} "
            f"tokens for {example.characters} characters ({example.characters / example.tokens:.0f} a token; "
            f"text usually takes 2-6){classes}: it merges what it should keep apart"
        )))
    return found


def _length(example: ExamplePrompt, name: str) -> list[Issue]:
    """The run's own error when this prompt is over data.max_prompt_length and data.overlong is error."""
    if example.tokens <= example.max_prompt_length or example.overlong != "error":
        return []
    return [error("data.max_prompt_length", (
        f"data.max_prompt_length: {name}: record 1: prompt is {example.tokens} tokens, over "
        f"max_prompt_length={example.max_prompt_length}; raise the limit, or set data.overlong to 'truncate' or 'skip'"
    ))]

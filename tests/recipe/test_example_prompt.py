"""validate shows what the model will see: the first training prompt through the actor's tokenizer, its token
count and the decode(encode(text)) round trip; warnings for a tokenizer that loads as another class than saved,
drops characters or merges them; the memory plan's vocabulary check against a checkpoint's real tokenizer; and a
skipped plan counted among the warnings. Tiny model directories are built here (a config, a real tokenizer), no
downloads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlhfctl.cli import app
from tests.recipe.builders import recipe_data, write_recipe

PROMPT = "what is two plus two?"
LETTERS = "abcdefghijklmnopqrstuvwxyz ?"  # 3 specials + these 28 = a 31-token tokenizer


def _generic_class() -> str:
    """What AutoTokenizer returns for a saved PreTrainedTokenizerFast with no model config beside it."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.__name__  # TokenizersBackend in transformers 5, an alias


GENERIC = _generic_class()


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "data.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in (PROMPT, "q1")))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def save_config(folder: Path, vocab_size: int) -> None:
    from transformers import Qwen2Config

    Qwen2Config(vocab_size=vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=4, intermediate_size=128, max_position_embeddings=128).save_pretrained(folder)


def save_char_tokenizer(folder: Path) -> int:
    """The project's CharTokenizer (100 tokens, a chat template) saved as the run saves it."""
    from rlhfctl.models.tokenizer import CharTokenizer

    tokenizer = CharTokenizer()
    tokenizer.save_pretrained(folder)
    return len(tokenizer)


def save_word_level(folder: Path, words: list[str], split_characters: bool = True) -> int:
    """A `tokenizers` WordLevel tokenizer (one token per character of ``words``, or per whole string) saved as a
    PreTrainedTokenizerFast; anything else encodes to <unk>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokens = ["<pad>", "<eos>", "<unk>", *words]
    backend = Tokenizer(models.WordLevel(vocab={token: i for i, token in enumerate(tokens)}, unk_token="<unk>"))
    if split_characters:
        backend.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    backend.decoder = decoders.Fuse()
    PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>",
                            unk_token="<unk>").save_pretrained(folder)
    return len(tokens)


def recipe(folder: Path, model: dict, **data) -> Path:
    return write_recipe(folder, recipe_data(data={"train_files": [str(folder / "data.jsonl")], **data},
                                            roles=_roles(model)))


def _roles(model: dict) -> dict:
    roles = recipe_data()["roles"]
    roles["actor"]["model"] = model
    return roles


def validate(*args: str):
    result = CliRunner().invoke(app, ["validate", *args])
    assert "Traceback" not in result.output, result.output
    return result


def json_report(path: Path) -> dict:
    result = validate(str(path), "--format", "json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_validate_prints_the_rendered_prompt_its_tokens_and_a_passing_round_trip(workdir):
    model = workdir / "model"
    save_config(model, save_char_tokenizer(model))
    path = recipe(workdir, {"path": str(model)}, apply_chat_template=True, max_prompt_length=48)
    result = validate(str(path))
    assert result.exit_code == 0, result.output
    text = f"user: {PROMPT}\nassistant: "
    assert ("example prompt: data.train_files[0] (" in result.stdout
            and "record 1, after the chat template (data.apply_chat_template), tokenizer CharTokenizer "
                "(roles.actor.model.path):" in result.stdout)
    assert f"  | user: {PROMPT}\n  | assistant: \n" in result.stdout
    assert "  tokens: 'u' 's' 'e' 'r' ':' ' ' 'w'" in result.stdout
    assert f"  {len(text)} tokens for {len(text)} characters (data.max_prompt_length 48)" in result.stdout
    assert "  round trip: decode(encode(text)) == text" in result.stdout
    assert "recipe is valid (0 warnings)" in result.stdout
    example = json_report(path)["example"]
    assert example["text"] == text and example["tokens"] == example["characters"] == len(text)
    assert example["round_trip_ok"] is True and example["key"] == "roles.actor.model.path"


def test_a_prompt_over_max_prompt_length_is_the_runs_own_error(workdir):
    model = workdir / "model"
    save_config(model, save_char_tokenizer(model))
    result = validate(str(recipe(workdir, {"path": str(model)}, max_prompt_length=8)))
    assert result.exit_code == 2
    assert f"data.max_prompt_length: {workdir / 'data.jsonl'}: record 1: prompt is {len(PROMPT)} tokens, over " \
           "max_prompt_length=8" in result.stderr
    truncated = validate(str(recipe(workdir, {"path": str(model)}, max_prompt_length=8, overlong="truncate")))
    assert truncated.exit_code == 0, truncated.output
    assert "over it: the run keeps the last 8 (data.overlong=truncate)" in truncated.stdout


def test_a_tokenizer_that_maps_characters_to_unk_is_a_warning_naming_the_key(workdir):
    model, tokenizer = workdir / "model", workdir / "tokenizer"
    save_config(model, 100)
    save_word_level(tokenizer, list("abcdefghijklmnopqrstuvwxyz "))  # no '?'
    result = validate(str(recipe(workdir, {"path": str(model), "tokenizer_path": str(tokenizer)})))
    assert result.exit_code == 0, result.output
    assert (f"warning: roles.actor.model.tokenizer_path: the {GENERIC} tokenizer drops or changes characters "
            "of the first prompt of data.train_files[0]") in result.stdout
    assert ("decode(encode(text)) differs from character 20: the text has '?', decoded '<unk>' "
            "(21 characters in, 25 out); 1 of its 21 tokens are '<unk>'") in result.stdout
    assert "saved tokenizer_class" not in result.stdout  # the class is the one saved
    assert "recipe is valid (1 warning)" in result.stdout


def test_a_tokenizer_loaded_as_another_class_than_saved_names_both_and_the_difference(workdir):
    """The real case: a generic fast tokenizer saved beside a qwen2 config.json; AutoTokenizer picks the class by
    model_type, and that class's pre-tokenizer drops the spaces (transformers 5)."""
    import transformers

    if int(transformers.__version__.split(".")[0]) < 5:
        pytest.skip("transformers 4 loads the class tokenizer_config.json names")
    model = workdir / "model"
    save_config(model, save_word_level(model, list(LETTERS)))
    result = validate(str(recipe(workdir, {"path": str(model)})))
    assert result.exit_code == 0, result.output
    assert (f"warning: roles.actor.model.path: {model}/tokenizer_config.json saved tokenizer_class "
            "'TokenizersBackend' but AutoTokenizer loaded 'Qwen2Tokenizer'") in result.stdout
    assert ("warning: roles.actor.model.path: the Qwen2Tokenizer tokenizer drops or changes characters of the first "
            "prompt") in result.stdout
    assert ("differs from character 4: the text has ' is two plus two?', decoded 'istwoplustwo?' "
            "(21 characters in, 17 out) (tokenizer_config.json saved 'TokenizersBackend', AutoTokenizer loaded "
            "'Qwen2Tokenizer')") in result.stdout
    assert "recipe is valid (2 warnings)" in result.stdout


def test_a_prompt_that_shrinks_to_a_few_tokens_is_a_warning(workdir):
    sentence = "please add the two numbers and give the answer"
    (workdir / "data.jsonl").write_text(json.dumps({"prompt": sentence}) + "\n")
    model, tokenizer = workdir / "model", workdir / "tokenizer"
    save_config(model, 100)
    save_word_level(tokenizer, [sentence], split_characters=False)
    result = validate(str(recipe(workdir, {"path": str(model), "tokenizer_path": str(tokenizer)})))
    assert result.exit_code == 0, result.output
    assert f"  1 tokens for {len(sentence)} characters" in result.stdout
    assert "  round trip: decode(encode(text)) == text" in result.stdout
    assert (f"warning: roles.actor.model.tokenizer_path: the {GENERIC} tokenizer shrinks the first prompt of "
            f"data.train_files[0] ({workdir / 'data.jsonl'}) to 1 tokens for {len(sentence)} characters") in result.stdout


def test_the_vocab_check_reads_the_checkpoints_config_json_and_its_own_tokenizer(workdir):
    """The plan used to pair a checkpoint with the 100-token character tokenizer: a 31-token model with its 31-token
    tokenizer got "model.config.vocab_size=31 is smaller than the tokenizer (100 tokens)"."""
    fits, small, tokenizer = workdir / "fits", workdir / "small", workdir / "tokenizer"
    save_config(fits, save_word_level(tokenizer, list(LETTERS)))
    save_config(small, 20)
    ok = json_report(recipe(workdir, {"path": str(fits), "tokenizer_path": str(tokenizer)}))
    assert ok["memory"]["skipped"] == {} and {role["role"] for role in ok["memory"]["roles"]} == {"actor", "reference"}
    assert not any("vocab_size" in issue["message"] for issue in ok["warnings"])
    result = validate(str(recipe(workdir, {"path": str(small), "tokenizer_path": str(tokenizer)})))
    assert result.exit_code == 0, result.output
    assert (f"warning: memory plan: roles.actor skipped ({small}/config.json has vocab_size=20, smaller than the "
            f"tokenizer (31 tokens, from model.tokenizer_path {tokenizer}): token ids 20..30 have no embedding row"
            ) in result.stdout
    assert "model.config.vocab_size" not in result.stdout and "100 tokens" not in result.stdout


def test_a_checkpoint_with_its_own_tokenizer_that_fits_gets_no_vocab_message(workdir):
    model = workdir / "model"
    save_config(model, save_word_level(model, list(LETTERS)))
    report = json_report(recipe(workdir, {"path": str(model)}))
    assert report["memory"]["skipped"] == {}
    assert not any("smaller than the tokenizer" in issue["message"] for issue in report["warnings"])


def test_a_skipped_memory_plan_counts_as_a_warning(workdir):
    small, tokenizer = workdir / "small", workdir / "tokenizer"
    save_word_level(tokenizer, list(LETTERS))
    save_config(small, 20)
    path = recipe(workdir, {"path": str(small), "tokenizer_path": str(tokenizer)})
    result = validate(str(path))
    assert result.exit_code == 0, result.output
    assert result.stdout.count("warning: memory plan: roles.") == 2  # actor, and the reference built like it
    assert "recipe is valid (2 warnings)" in result.stdout
    warnings = json_report(path)["warnings"]
    assert [issue["key_path"] for issue in warnings] == ["roles.actor.model", "roles.reference.model"]


def test_a_directory_with_only_config_json_is_planned_and_warns_that_it_has_no_tokenizer(workdir):
    model = workdir / "model"
    save_config(model, 100)
    report = json_report(recipe(workdir, {"path": str(model)}))
    assert report["example"] is None and report["memory"]["skipped"] == {}
    assert [issue["message"].split(" (")[0] for issue in report["warnings"]] == [
        f"roles.actor.model.path: {model} holds no tokenizer files"]

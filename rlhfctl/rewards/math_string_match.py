r"""MATH answers by normalized string match: the last ``\boxed{...}`` against the reference, both normalized.

This is the Hendrycks et al. MATH grader ("Measuring Mathematical Problem Solving With the MATH
Dataset", NeurIPS 2021), as EleutherAI's lm-evaluation-harness and verl's
``verl/utils/reward_score/math_reward.py`` run it; ``tests/rewards`` checks ours against verl's scores
case by case, quirks included:

- the answer is the text after the last ``"\boxed "`` (up to the next ``$``) when a ``"\boxed "``
  (with a space) appears anywhere, else the contents of the last ``\boxed{...}`` (braces balanced);
  ``\fbox{...}`` and ``\boxed`` without a brace give no answer (verl's unboxing accepts only
  ``\boxed{`` and ``\boxed ``);
- :func:`normalize_math_answer` rewrites both strings (the steps are listed there) and they must be
  equal; if either cannot be normalized (a bare ``\sqrt`` or ``\frac`` at the end, two
  ``"\text{ "`` units), the raw strings are compared instead.
"""

from __future__ import annotations

__all__ = ["UnnormalizableAnswer", "boxed_answer", "math_answers_match", "normalize_math_answer"]

_BOXED_SPACE = "\\boxed "
_BOXED = "\\boxed"
_BOXED_BRACE = "\\boxed{"
_UNITS = "\\text{ "

# Literal rewrites, in order, before and after the units are cut off.
_BEFORE_UNITS = (
    ("\n", ""),
    ("\\!", ""),  # negative thin space
    ("\\\\", "\\"),
    ("tfrac", "frac"),
    ("dfrac", "frac"),
    ("\\left", ""),
    ("\\right", ""),
    ("^{\\circ}", ""),  # degrees
    ("^\\circ", ""),
    ("\\$", ""),
)
_AFTER_UNITS = (
    ("\\\\%", ""),
    ("\\%", ""),
    (" .", " 0."),  # ".5" reads as "0.5"
    ("{.", "{0."),
)


class UnnormalizableAnswer(Exception):
    """The answer has a shape the normalization cannot rewrite (so it is compared raw)."""


def boxed_answer(text: str) -> str | None:
    r"""The last boxed answer of ``text`` (see the module docstring), or None when there is none."""
    if _BOXED_SPACE in text:
        return text.rsplit(_BOXED_SPACE, 1)[1].split("$", 1)[0]
    start = text.rfind(_BOXED)
    if start < 0 or not text.startswith(_BOXED_BRACE, start):
        return None
    depth = 0
    for index in range(start + len(_BOXED), len(text)):
        if text[index] == "{":
            depth += 1
        elif text[index] == "}":
            depth -= 1
            if depth == 0:
                return text[start + len(_BOXED_BRACE) : index]
    return None  # the brace never closes


def _cut_units(text: str) -> str:
    r"""Drop a trailing unit written ``"\text{ ...}"``: everything from its ``"\text{ "`` on."""
    pieces = text.split(_UNITS)
    if len(pieces) > 2:
        raise UnnormalizableAnswer("more than one unit")
    return pieces[0]


def _brace_sqrt_arguments(text: str) -> str:
    r"""``\sqrt3`` -> ``\sqrt{3}``: a one-character argument gets braces."""
    head, *pieces = text.split("\\sqrt")
    rebuilt = [head]
    for piece in pieces:
        if not piece:
            raise UnnormalizableAnswer("\\sqrt with nothing after it")
        rebuilt.append("\\sqrt" + (piece if piece[0] == "{" else "{" + piece[0] + "}" + piece[1:]))
    return "".join(rebuilt)


def _brace_frac_arguments(text: str) -> str:
    r"""``\frac12`` -> ``\frac{1}{2}``, ``\frac1{72}`` -> ``\frac{1}{72}``; a ``\frac`` with one character after it leaves the string as it was."""
    head, *pieces = text.split("\\frac")
    rebuilt = [head]
    for piece in pieces:
        if not piece:
            raise UnnormalizableAnswer("\\frac with nothing after it")
        if piece[0] == "{":
            rebuilt.append("\\frac" + piece)
        elif len(piece) == 1:
            return text
        else:
            second = piece[1] if piece[1] == "{" else "{" + piece[1] + "}"
            rebuilt.append("\\frac{" + piece[0] + "}" + second + piece[2:])
    return "".join(rebuilt)


def _slash_to_frac(text: str) -> str:
    r"""``3/4`` -> ``\frac{3}{4}``, only for two integers written plainly (``-3/4`` yes, ``03/4`` no)."""
    if text.count("/") != 1:
        return text
    numerator, denominator = text.split("/")
    try:
        top, bottom = int(numerator), int(denominator)
    except ValueError:
        return text
    return f"\\frac{{{top}}}{{{bottom}}}" if text == f"{top}/{bottom}" else text


def normalize_math_answer(text: str) -> str:
    r"""Rewrite an answer so that equal answers written differently compare equal as strings.

    In order: drop newlines and ``\!``; ``\\`` -> ``\``; ``\tfrac``/``\dfrac`` -> ``\frac``; drop
    ``\left``, ``\right``, degrees and ``\$``; cut a ``"\text{ "`` unit; drop ``\%``; ``.5`` -> ``0.5``;
    ``k = 5`` -> ``5`` (one ``=`` and at most two characters before it); ``\sqrt3`` -> ``\sqrt{3}``;
    drop spaces; ``\frac12`` -> ``\frac{1}{2}``; ``0.5`` -> ``\frac{1}{2}``; ``3/4`` -> ``\frac{3}{4}``.
    Raises ``UnnormalizableAnswer`` for the shapes the module docstring lists.
    """
    for old, new in _BEFORE_UNITS:
        text = text.replace(old, new)
    text = _cut_units(text) if _UNITS in text else text
    for old, new in _AFTER_UNITS:
        text = text.replace(old, new)
    if not text:
        return text
    if text[0] == ".":
        text = "0" + text
    sides = text.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:
        text = sides[1]
    if "\\sqrt" in text:
        text = _brace_sqrt_arguments(text)
    text = _brace_frac_arguments(text.replace(" ", ""))
    if text == "0.5":
        text = "\\frac{1}{2}"
    return _slash_to_frac(text)


def math_answers_match(answer: str, reference: str) -> bool:
    """Whether two answers are equal after normalization (raw equality when either cannot be normalized)."""
    try:
        return normalize_math_answer(answer) == normalize_math_answer(reference)
    except UnnormalizableAnswer:
        return answer == reference

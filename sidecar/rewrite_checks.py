"""Whether a finished rewrite is an edit worth applying, judged without the model.

A small model's reply can be broken in ways a parser sees at once: Python that no longer
parses in its file (when the file did), or the selection handed back unchanged although
the instruction asked for a change. Applying either would leave the user a broken file or
a silent no-op; ``no_confident_edit`` says why instead, and the rewrite is answered with
"no confident edit" (rewrite_request.decide, echoline rewrite's exit status 3).

Python only: ``ast`` is at hand in-process and exact; other languages would need a parser
per language, and a wrong refusal costs more than a missed one.
"""

from __future__ import annotations

import ast
import warnings

from echoline.sidecar.prompts import REPRODUCE_INSTRUCTION, language_for
from echoline.sidecar.rewrite_stops import TOO_LONG

NO_CONFIDENT_EDIT = "no confident edit"
#: The one refusal that withholds nothing: the edit changes no text (``withholds``).
UNCHANGED = f"{NO_CONFIDENT_EDIT}: the model returned the selection unchanged"


def withholds(reason: str | None) -> bool:
    """Whether a refusal keeps the edit from being applied: a broken edit is withheld; an
    unchanged one would change nothing, so the language server applies that no-op and says
    why beside it (``noConfidentEdit``), while ``echoline rewrite`` and the benchmark
    count it as no edit."""
    return bool(reason) and reason != UNCHANGED


def _parse_error(source: str) -> SyntaxError | None:
    """The SyntaxError ``source`` raises, or None when it parses."""
    try:
        with warnings.catch_warnings():  # "invalid escape sequence" and the like are no error
            warnings.simplefilter("ignore")
            ast.parse(source)
    except SyntaxError as exc:
        return exc
    except (ValueError, RecursionError, MemoryError):  # null bytes, absurd nesting
        return SyntaxError("cannot be parsed")
    return None


def asks_for_change(instruction: str) -> bool:
    """Whether ``instruction`` asks for a change (empty, or the reproduce one, does not)."""
    text = instruction.strip()
    return bool(text) and text != REPRODUCE_INSTRUCTION


def no_confident_edit(file_text: str, start: int, end: int, new_text: str, instruction: str, *,
                      name: str = "", stopped_by: str | None = None) -> str | None:
    """Why replacing ``file_text[start:end]`` with ``new_text`` is no confident edit, or None.

    - the reply was cut because it grew far past the selection (``stopped_by`` TOO_LONG);
    - ``instruction`` asks for a change and ``new_text`` is the selection unchanged;
    - the file is Python (by ``name``), parses as it is, and does not with the edit.
    """
    selection = file_text[start:end]
    if stopped_by == TOO_LONG:
        lines = selection.count("\n") + (0 if selection.endswith("\n") else 1)
        return (f"{NO_CONFIDENT_EDIT}: the reply ran on far past the {lines}-line selection "
                "and was stopped; nothing applied")
    if stopped_by is not None and not new_text.strip() and selection.strip():
        return (f"{NO_CONFIDENT_EDIT}: the reply only repeated the code around the selection "
                f"({stopped_by}); nothing applied")
    if asks_for_change(instruction) and new_text == selection:
        return UNCHANGED
    if language_for(name) == "python" and _parse_error(file_text) is None:
        err = _parse_error(file_text[:start] + new_text + file_text[end:])
        if err is not None:
            where = f" (line {err.lineno})" if err.lineno else ""
            return (f"{NO_CONFIDENT_EDIT}: the edited file would not parse as Python{where}: "
                    f"{err.msg}; nothing applied")
    return None

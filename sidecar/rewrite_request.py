"""``echoline.rewrite`` without the server: its arguments, its progress, and what to answer.

The handler in ``sidecar.server`` only sequences these: structure the arguments
(``RewriteArgs``, through the lsprotocol converter), queue the job, report progress
(``RewriteProgress``), then ask ``decide`` what a finished reply means — answer with it,
apply it, or neither and why. ``decide`` is pure, so every outcome is tested without a
server (tests/test_rewrite_request.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Literal

import attrs
import cattrs
from echoline.sidecar.lsp_utils import invalid, parse_position, short
from echoline.sidecar.progress import PROGRESS_INTERVAL_S, WorkDone
from echoline.sidecar.rewrite import Progress
from lsprotocol import types

COMMAND = "echoline.rewrite"
NOTIFY_REWRITE_PROGRESS = "echoline/rewriteProgress"


@attrs.define(frozen=True)
class RewriteArgs:
    """The one argument of ``echoline.rewrite`` (docs/sidecar.md)."""

    uri: str
    version: int  # the document version the range was read from
    range: types.Range
    instruction: str = ""
    mode: Literal["apply", "preview"] = "apply"


def _structure(raw: Any, _cls: type) -> RewriteArgs:
    """Each field checked with a message that names it (a cattrs error names a path only)."""
    if not isinstance(raw, dict):
        raise invalid(f"{COMMAND}'s argument must be {{uri, version, range, instruction, mode}}, "
                      f"got {short(raw)}")
    uri = raw.get("uri")
    if not isinstance(uri, str) or not uri:
        raise invalid("'uri' must be a non-empty string")
    version = raw.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise invalid(f"'version' must be an integer (the document version you read), got {short(version)}")
    rng = raw.get("range")
    if not isinstance(rng, dict):
        raise invalid(f"'range' must be {{start, end}}, got {short(rng)}")
    try:
        start = parse_position(rng.get("start"), "range.start")
        end = parse_position(rng.get("end"), "range.end")
    except ValueError as exc:
        raise invalid(str(exc)) from None
    if (end.line, end.character) < (start.line, start.character):
        raise invalid("range.end is before range.start")
    instruction = raw.get("instruction") or ""
    if not isinstance(instruction, str):
        raise invalid(f"'instruction' must be a string, got {type(instruction).__name__}")
    mode = raw.get("mode") or "apply"
    if mode not in ("apply", "preview"):
        raise invalid(f"'mode' must be \"apply\" or \"preview\", got {short(mode)}")
    return RewriteArgs(uri, version, types.Range(start=start, end=end), instruction, mode)


def register(converter: cattrs.Converter) -> None:
    """Teach ``converter`` (the server's lsprotocol converter) to build ``RewriteArgs``."""
    converter.register_structure_hook(RewriteArgs, _structure)


def rewrite_args(converter: cattrs.Converter, args: tuple[Any, ...]) -> RewriteArgs:
    """The command's arguments (exactly one object) as ``RewriteArgs``; InvalidParams if not."""
    if len(args) != 1 or not isinstance(args[0], dict):
        raise invalid(f"{COMMAND} takes ONE argument {{uri, version, range, instruction, mode}}; "
                      f"got {len(args)} argument(s)")
    return converter.structure(args[0], RewriteArgs)


# ---- what a finished reply means ----------------------------------------------------------


@attrs.define(frozen=True)
class Verdict:
    """``apply``: send the edit to the client; otherwise answer ``applied: false`` with
    ``reason``. ``progress``: the end message of the work-done progress."""

    apply: bool
    reason: str
    progress: str
    edit_in_answer: bool = False  # a preview carries the edit for the client to show


def decide(*, finish_reason: str, mode: str, max_tokens: int, request_cancelled: bool,
           version: int, current_version: int | None, refusal: str | None = None) -> Verdict:
    """What to do with a finished rewrite, from facts alone (the order is the precedence).

    ``current_version``: the document's version now (None: closed meanwhile); the edit is
    tied to ``version``, the one the range was read from. ``refusal``: why the reply is no
    confident edit that must not be applied (``RewriteOutcome.withheld``: it would not
    parse, it ran away): not applied, with that reason. A preview is still shown (the user
    judges it; the server's answer carries the reason beside it, ``noConfidentEdit``).
    """
    if finish_reason == "cancelled":
        return Verdict(False, "cancelled", "cancelled")
    if mode == "preview":
        return Verdict(False, "preview", "preview ready", edit_in_answer=True)
    if refusal:
        return Verdict(False, refusal, "no confident edit; not applied")
    if finish_reason == "length":
        return Verdict(False, f"the reply reached maxTokens ({max_tokens}) before its end; "
                       "edit not applied (raise echoline.maxTokens or select less)",
                       "reply truncated; not applied")
    if request_cancelled:
        return Verdict(False, "cancelled", "cancelled")
    if current_version != version:
        return Verdict(False, f"document changed while generating (version {version} -> "
                       f"{current_version}); edit not applied", "document changed; not applied")
    return Verdict(True, "apply", "applying")


# ---- progress -----------------------------------------------------------------------------


class RewriteProgress:
    """A rewrite's progress: ``echoline/rewriteProgress`` (the text so far, for a live
    preview) and the work-done bar, at most every ``PROGRESS_INTERVAL_S``.

    ``report`` runs on the worker thread; ``post`` hands a call to the event loop.
    """

    def __init__(self, uri: str, bar: WorkDone, notify: Callable[[str, Any], None],
                 post: Callable[..., None]) -> None:
        self.uri = uri
        self.bar = bar
        self._notify = notify
        self._post = post
        self._last = 0.0

    def report(self, p: Progress) -> None:  # worker thread
        now = time.monotonic()
        if now - self._last < PROGRESS_INTERVAL_S:
            return
        self._last = now
        self._post(self._send, p)

    def _send(self, p: Progress) -> None:  # event loop
        self._notify(NOTIFY_REWRITE_PROGRESS, {
            "uri": self.uri, "text": p.text, "tokens": p.tokens,
            "tokS": round(p.tok_s, 2), "acceptance": round(p.acceptance, 4),
        })
        self.bar.report(f"{p.tokens} tokens, {p.tok_s:.1f} tok/s, acceptance {p.acceptance:.0%}\n{p.text}")

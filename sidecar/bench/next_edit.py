"""``echoline bench next-edit``: how often an edit prediction is RIGHT, and how fast it is shown.

Cases (``data/next_edit_cases.json`` beside this module, mined by ``tools/mine_next_edit_cases.py``
from the commit histories of public, permissively licensed repositories; source, commit and
licence per case): the file before, the author's first edit replayed as a ``didChange``
(through ``sidecar.edit_history``, as the server sees it), the cursor at its end, and the
author's next edit as the expected answer. A prediction is a HIT when applying it gives
exactly the expected text.

Systems compared on the same cases: ``nothing`` (never shows anything), ``baseline`` (no
model: repeat the last edit's substitution at its next occurrence within the region) and
the model (``--model``, prompt ``--format``), and ``gated``: the model's prediction shown
only when it repeats the user's last change (``repeats_last``). Per system: hit rate (hits / cases),
precision (hits / shown), how often nothing is shown, and harm (a shown prediction that
undoes the user's own edit; the job never shows one, ``suppressed_undo`` counts those it
held back).

Speed: each prediction runs cold (a fresh session: every prompt token run after the pause)
and warm (the prompt prefilled first, as a warm-up during the pause would: only its last
token and the reply are timed) with exact speculation, and, unless ``--no-plain``, warm
with plain decoding on the same prompt: p50/p90 of each, the speculation's gain (warm plain
/ warm spec), and whether the two replies are identical over the tokens the decision used
(they must be).

Prints one line per case and a summary; with ``--json`` one JSON object:
``{"model", "format", "split", "cases", "systems": {name: {"cases", "hits", "shown",
"hit_rate", "precision", "none_rate", "harm"}}, "speed": {...}, "results": [...]}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from echoline.sidecar.edit_history import EditEvent, EditHistory, changed_span
from echoline.sidecar.engine_like import EngineLike
from echoline.sidecar.next_edit import (
    DEFAULT_FORMAT,
    FORMATS,
    REGION_LINES,
    Edit,
    next_edit_session,
    next_edit_warm_job,
    prompt_parts,
    run_next_edit,
    undoes,
)
from echoline.sidecar.next_edit_repeat import apply_edit, repeat_last_edit

CASES_FILE = Path(__file__).with_name("data") / "next_edit_cases.json"


@dataclass(frozen=True)
class Case:
    id: str
    split: str
    repo: str
    commit: str
    licence: str
    path: str
    before: str
    edited: str
    expected: str
    cursor: int

    @property
    def uri(self) -> str:
        return "file:///bench/" + self.path


def load_cases(split: str = "all", ids: list[str] | None = None, path: Path = CASES_FILE) -> list[Case]:
    """The cases of ``split`` ("all", "tune", "heldout"), or only ``ids``."""
    raw = json.loads(path.read_text())["cases"]
    cases = [Case(c["id"], c["split"], c["repo"], c["commit"], c["licence"], c["path"], c["before"],
                  c["edited"], c["expected"], c["cursor"]) for c in raw]
    if ids:
        unknown = set(ids) - {c.id for c in cases}
        if unknown:
            raise SystemExit(f"echoline bench next-edit: unknown case id(s): {', '.join(sorted(unknown))}")
        return [c for c in cases if c.id in ids]
    return [c for c in cases if split == "all" or c.split == split]


def case_events(case: Case) -> list[EditEvent]:
    """The user's edit as the server records it: opened at ``before``, changed to ``edited``."""
    history = EditHistory(path_of=lambda _uri: case.path)
    history.opened(case.uri, case.before)
    history.changed(case.uri, case.edited)
    return history.events()


def baseline_predict(text: str, cursor: int, event: EditEvent | None, region_lines: int = REGION_LINES
                     ) -> Edit | None:  # fmt: skip
    """No model: the product's ``repeat`` predictor (``sidecar/next_edit_repeat.py``)."""
    return repeat_last_edit(text, cursor, event, region_lines)


def repeats_last(text: str, edit: Edit, event: EditEvent | None) -> bool:
    """Whether ``edit`` makes the same kind of change as ``event``: what it adds holds what
    the event added (or, for a deletion, it removes what the event removed). The gate of
    the ``gated`` system: the model's prediction shown only when it repeats the user's edit."""
    if event is None:
        return False
    span = changed_span(text[edit.start : edit.end], edit.text)
    if span is None:
        return False
    s, old_end, new_end, _ = span
    removed, added = text[edit.start + s : edit.start + old_end], edit.text[s:new_end]
    if event.added.strip():
        return event.added.strip() in added or event.added.strip() in edit.text
    return bool(event.removed.strip()) and event.removed.strip() in removed


def _warm_time(engine: EngineLike, parts: Any, fmt: str, spec: bool, session: str) -> tuple[float, Any]:
    """(seconds, outcome) of a prediction whose prompt was prefilled first (as a warm-up
    during the pause would): the time is the prompt's last token and the reply only, the
    part speculation speeds up."""
    engine.prefill(FORMATS[fmt](engine, parts).ids, session=session)
    t0 = time.perf_counter()
    out = run_next_edit(engine, parts, fmt=fmt, spec=spec, session=session)
    return time.perf_counter() - t0, out


def _rested_time(engine: EngineLike, case: Case, parts: Any, fmt: str, region_lines: int,
                 session: str) -> float:
    """Seconds of a prediction after the server's warm-up at the resting cursor, before the
    user's edit (``next_edit_warm_job`` on the text before it: the prompt's file block up to
    the region), as a user who pauses, edits, then pauses again meets it."""
    warm = next_edit_warm_job(case.path, session, case.before, min(case.cursor, len(case.before)), fmt=fmt,
                              region_lines=region_lines)
    engine.sessions.drop(next_edit_session(session))
    warm(engine, threading.Event(), None)
    t0 = time.perf_counter()
    run_next_edit(engine, parts, fmt=fmt, spec=True, session=next_edit_session(session))
    seconds = time.perf_counter() - t0
    engine.sessions.drop(next_edit_session(session))
    return seconds


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    vals = sorted(values)
    return round(vals[min(len(vals) - 1, int(q * len(vals)))], 3)


def _summary(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    n = len(rows)
    shown = sum(r[key]["shown"] for r in rows)
    hits = sum(r[key]["hit"] for r in rows)
    harm = sum(r[key]["harm"] for r in rows)
    return {"cases": n, "hits": hits, "shown": shown, "hit_rate": round(hits / n, 4) if n else None,
            "precision": round(hits / shown, 4) if shown else None,
            "none_rate": round((n - shown) / n, 4) if n else None, "harm": harm}


def _judge(case: Case, edit: Edit | None, event: EditEvent | None) -> dict[str, Any]:
    if edit is None:
        return {"shown": False, "hit": False, "harm": False}
    return {"shown": True, "hit": apply_edit(case.edited, edit) == case.expected,
            "harm": event is not None and undoes(case.edited, edit, event),
            "edit": [edit.start, edit.end, edit.text]}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from echoline.engine.api import Engine

    cases = load_cases(getattr(args, "split", "all"), getattr(args, "case", []) or [])
    limit = getattr(args, "limit", None)
    if limit:
        cases = cases[:limit]
    fmt = getattr(args, "format", None) or DEFAULT_FORMAT
    region_lines = getattr(args, "region_lines", None) or REGION_LINES
    plain_too = not getattr(args, "no_plain", False)
    engine = Engine.load(args.model, backend=args.backend)
    engine.warm_up()
    rows: list[dict[str, Any]] = []
    spec_s: list[float] = []
    cold_s: list[float] = []
    rested_s: list[float] = []
    plain_s: list[float] = []
    identical = 0
    for n, case in enumerate(cases):
        events = case_events(case)
        last = events[-1] if events else None
        parts = prompt_parts(case.path, case.edited, case.cursor, events, case.uri, region_lines)
        t0 = time.perf_counter()
        out = run_next_edit(engine, parts, fmt=fmt, spec=True, session=f"bench-ne-cold-{n}")
        cold_s.append(time.perf_counter() - t0)
        spec_s.append(_warm_time(engine, parts, fmt, True, f"bench-ne-spec-{n}")[0])
        rested_s.append(_rested_time(engine, case, parts, fmt, region_lines, f"bench-ne-rested-{n}"))
        row: dict[str, Any] = {
            "id": case.id, "split": case.split, "repo": case.repo, "commit": case.commit, "licence": case.licence,
            "nothing": _judge(case, None, last),
            "baseline": _judge(case, baseline_predict(case.edited, case.cursor, last, region_lines), last),
            "model": _judge(case, out.edits[0] if out.edits else None, last),
            "gated": _judge(case, out.edits[0] if out.edits and repeats_last(case.edited, out.edits[0], last)
                            else None, last),
            "reason": out.reason, "prompt_tokens": out.prompt_tokens, "used_tokens": out.used_tokens,
            "cold_s": round(cold_s[-1], 3), "spec_s": round(spec_s[-1], 3), "rested_s": round(rested_s[-1], 3),
            "suppressed_undo": out.reason == "undoes the last edit",
        }
        if plain_too:
            seconds, ref = _warm_time(engine, parts, fmt, False, f"bench-ne-plain-{n}")
            plain_s.append(seconds)
            same = (ref.token_ids[: ref.used_tokens] == out.token_ids[: out.used_tokens]
                    and ref.edits == out.edits)
            identical += same
            row.update(plain_s=round(plain_s[-1], 3), identical=same)
        for sess in (f"bench-ne-cold-{n}", f"bench-ne-spec-{n}", f"bench-ne-plain-{n}"):
            engine.sessions.drop(sess)
        rows.append(row)
        mark = "HIT " if row["model"]["hit"] else ("miss" if row["model"]["shown"] else "none")
        print(f"{case.id:32s} {case.split:7s} model={mark} baseline={'HIT ' if row['baseline']['hit'] else '-   '}"
              f" {row['reason']:22s} cold {row['cold_s']:6.2f}s warm {row['spec_s']:6.2f}s"
              + (f" plain {row['plain_s']:6.2f}s" if plain_too else ""),
              flush=True)
    systems = {k: _summary(rows, k) for k in ("nothing", "baseline", "model", "gated")}
    speed = {"cold_p50_s": _pct(cold_s, 0.5), "cold_p90_s": _pct(cold_s, 0.9), "spec_p50_s": _pct(spec_s, 0.5), "spec_p90_s": _pct(spec_s, 0.9),
             "rested_p50_s": _pct(rested_s, 0.5), "rested_p90_s": _pct(rested_s, 0.9),
             "plain_p50_s": _pct(plain_s, 0.5), "plain_p90_s": _pct(plain_s, 0.9),
             "gain_median": round(statistics.median(p / s for p, s in zip(plain_s, spec_s, strict=False)), 3)
             if plain_s else None,
             "identical": identical if plain_too else None}
    print(f"\n{'system':10s} {'hit rate':>9s} {'precision':>9s} {'none':>6s} {'harm':>5s}  (cases {len(rows)})")
    for name, s in systems.items():
        def f(v: Any) -> str:
            return "-" if v is None else f"{v:.3f}"
        print(f"{name:10s} {f(s['hit_rate']):>9s} {f(s['precision']):>9s} {f(s['none_rate']):>6s} {s['harm']:5d}")
    print(f"speed: cold p50 {speed['cold_p50_s']} s, p90 {speed['cold_p90_s']} s; after the cursor's warm-up "
          f"p50 {speed['rested_p50_s']} s, p90 {speed['rested_p90_s']} s; warm spec p50 {speed['spec_p50_s']} s, p90 {speed['spec_p90_s']} s; plain p50 {speed['plain_p50_s']} s; "
          f"gain x{speed['gain_median']}; identical {speed['identical']}/{len(rows) if plain_too else '-'}")
    return {"model": engine.model_name, "backend": engine.backend_variant, "format": fmt, "region_lines": region_lines,
            "split": getattr(args, "split", "all"), "cases": len(rows), "systems": systems, "speed": speed,
            "suppressed_undo": sum(r["suppressed_undo"] for r in rows), "results": rows}

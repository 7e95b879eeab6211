"""``echoline bench edits``: how often a model's rewrite is RIGHT, checked by running it.

Each case of ``sidecar.bench.edit_cases`` goes through the same path as ``echoline rewrite``
and the editor's rewrite command (``run_rewrite``: the rewrite prompt, exact speculative
decoding, the code taken out of the fence). The edited file is then run against the
case's check (``sidecar.bench.edit_checks``). Quality is a pass rate, per split: prompts are
tuned on ``tune`` and ``heldout`` is reported untouched, so a gain there is not the
benchmark being learned.

Prints one line per case, a summary table, and (with ``--json``) one JSON object:
``{"model", "backend", "cases", "passed", "pass_rate", "per_split": {split: {"cases",
"passed", "pass_rate"}}, "per_language": {...}, "per_set": {...}, "runaway": {...},
"skipped": [...], "results": [...]}``.

``--edit-set`` picks the one-function cases ("function"), the multi-line refactors of
``data/edit_cases_multiline.toml`` ("multiline") or both ("all", the default); ``--split``
applies within it. ``runaway`` counts the replies that ran to ``maxTokens`` ("length"),
the ones that still duplicate the code after the selection ("duplicates_after", which the
stop rules of ``sidecar.rewrite_stops`` should keep at 0), the stop rules that fired
("stopped") and the replies answered "no confident edit" ("refused"); "count" is the
first two together, whose target is 0.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

from echoline.sidecar.bench.edit_cases import CASES, EditCase
from echoline.sidecar.bench.edit_checks import (
    RuntimeUnavailable,
    apply_edit,
    run_check,
    runtime_available,
    split_lines,
)
from echoline.sidecar.rewrite import run_rewrite
from echoline.sidecar.rewrite_stops import duplicates_after


def selection_offsets(case: EditCase) -> tuple[int, int]:
    """Character offsets [start, end) of the case's selected lines."""
    lines = split_lines(case.source)
    first, last = case.lines
    start = sum(len(x) for x in lines[: first - 1])
    return start, start + sum(len(x) for x in lines[first - 1 : last])


def pick_cases(split: str, ids: list[str], edit_set: str = "all") -> list[EditCase]:
    chosen = [c for c in CASES if (split == "all" or c.split == split)
              and (edit_set == "all" or c.kind == edit_set)]
    if ids:
        unknown = set(ids) - {c.id for c in CASES}
        if unknown:
            raise SystemExit(f"echoline bench edits: unknown case id(s): {', '.join(sorted(unknown))}")
        chosen = [c for c in chosen if c.id in ids]
    return chosen


def _reason(output: str) -> str:
    """The line of a failed check's output that says why (not node's version banner)."""
    lines = [ln for ln in output.splitlines() if ln.strip() and not ln.startswith("Node.js v")]
    telling = [ln for ln in lines if "FAIL" in ln or "Error" in ln or "timed out" in ln]
    return (telling or lines or [""])[-1].strip()


def _rate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    passed = sum(r["passed"] for r in rows)
    return {"cases": len(rows), "passed": passed, "pass_rate": round(passed / len(rows), 4) if rows else None}


def _group(rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    return {k: _rate([r for r in rows if r[key] == k]) for k in sorted({r[key] for r in rows})}


def _runaway(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Replies that ran away: to maxTokens, or on into the code after the selection."""
    length = sum(r["finish_reason"] == "length" for r in rows)
    dup = sum(r["duplicates_after"] for r in rows)
    stopped: dict[str, int] = {}
    for r in rows:
        if r["stopped_by"]:
            stopped[r["stopped_by"]] = stopped.get(r["stopped_by"], 0) + 1
    return {"count": length + dup, "length": length, "duplicates_after": dup, "stopped": stopped,
            "refused": sum(bool(r["refusal"]) for r in rows)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from echoline.engine.api import Engine

    cases = pick_cases(getattr(args, "split", "all"), getattr(args, "case", []) or [],
                       getattr(args, "edit_set", "all") or "all")
    engine = Engine.load(args.model, backend=args.backend)
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    for case in cases:
        if not runtime_available(case.language):
            skipped.append(case.id)
            continue
        start, end = selection_offsets(case)
        t0 = time.perf_counter()
        out = run_rewrite(engine, case.source, start, end, case.instruction, name=case.filename,
                          max_tokens=args.max_tokens, spec=True)
        seconds = time.perf_counter() - t0
        # a reply answered "no confident edit" leaves the file as it was (what a user gets)
        edited = case.source if out.refusal else apply_edit(case, out.text)
        try:
            passed, detail = run_check(case, edited)
        except RuntimeUnavailable:
            skipped.append(case.id)
            continue
        row = {
            "id": case.id, "split": case.split, "language": case.language, "passed": passed,
            "seconds": round(seconds, 3), "generated_tokens": out.stats.get("generated_tokens"),
            "tokens_per_s": round(out.stats.get("tokens_per_s", 0.0), 2),
            "acceptance": round(out.stats.get("acceptance", 0.0), 3),
            "finish_reason": out.finish_reason, "text": out.text,
            "detail": "" if passed else (out.refusal or _reason(detail)),
            "set": case.kind, "stopped_by": out.stopped_by, "refusal": out.refusal,
            "duplicates_after": duplicates_after(out.text, case.source[end:]),
        }
        rows.append(row)
        note = f" [{out.stopped_by}]" if out.stopped_by else ""
        sys.stderr.write(f"{'PASS' if passed else 'fail'} {case.id:<24} {case.split:<8} "
                         f"{seconds:6.1f} s  {row['generated_tokens']:>4} tok{note}  {row['detail'][:60]}\n")
    result = {
        "model": engine.model_name,
        "backend": engine.backend_name,
        **_rate(rows),
        "per_split": _group(rows, "split"),
        "per_language": _group(rows, "language"),
        "per_set": _group(rows, "set"),
        "runaway": _runaway(rows),
        "median_seconds": round(statistics.median(r["seconds"] for r in rows), 3) if rows else None,
        "skipped": skipped,
        "results": rows,
    }
    print(f"\nmodel {result['model']} ({result['backend']}): "
          f"{result['passed']}/{result['cases']} edits pass ({(result['pass_rate'] or 0):.0%})")
    print(f"{'split/language':<16} {'pass':>5} {'cases':>6} {'rate':>6}")
    for label, group in [*result["per_split"].items(), *result["per_language"].items(),
                         *result["per_set"].items()]:
        print(f"{label:<16} {group['passed']:>5} {group['cases']:>6} {group['pass_rate']:>6.0%}")
    for split in sorted(result["per_split"]):  # the multi-line refactors by split
        group = _rate([r for r in rows if r["split"] == split and r["set"] == "multiline"])
        if group["cases"] and len(result["per_set"]) > 1:
            print(f"{'multiline/' + split:<16} {group['passed']:>5} {group['cases']:>6} {group['pass_rate']:>6.0%}")
    run_away = result["runaway"]
    print(f"runaway replies: {run_away['count']} (to maxTokens {run_away['length']}, duplicating the "
          f"code after the selection {run_away['duplicates_after']}); stop rules fired: "
          f"{run_away['stopped'] or 'none'}; no confident edit: {run_away['refused']}")
    if skipped:
        print(f"skipped (no runtime here): {', '.join(skipped)}")
    return result

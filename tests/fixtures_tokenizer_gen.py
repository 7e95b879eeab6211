"""Regenerate tests/data/llamacpp-tokenizer.json with llama.cpp (dev-only, never imported by tests).

Step 1 (project venv): ``python tests/fixtures_tokenizer_gen.py texts OUT_DIR`` writes the texts
and a vocab-only GGUF (SmolLM2's vocabulary, ``pre`` = qwen2).
Step 2 (a venv with llama-cpp-python): ``python tests/fixtures_tokenizer_gen.py ids OUT_DIR``
tokenizes every text with llama.cpp (``special`` on and off) into tests/data/llamacpp-tokenizer.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

MODELS = Path.home() / ".cache" / "echoline" / "models"  # step 2 runs without echoline installed
SMOL = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA = "gemma-3-270m-q4_k_m.gguf"
QWEN2_VOCAB = "smollm-vocab-pre-qwen2.gguf"


def write_texts(out: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import numpy as np
    from echoline.engine.gguf_file import GGUFFile
    from test_tokenizer import TRICKY, _write_vocab_gguf

    root = Path(np.__file__).parent
    files = sorted(p for p in root.rglob("*.py") if 2_000 < p.stat().st_size < 60_000)
    code = [p.read_text(encoding="utf-8")[:3000] for p in files[:: max(1, len(files) // 6)][:6]]
    extra = [
        "<|im_start|>user\nhi <|im_end|> there<|endoftext|>",
        "<start_of_turn>user\nx<end_of_turn>\n<start_of_turn>model\n",
        "a<bos>b<eos>c<pad><unk><mask>",
        "<|fim_prefix|>def f(<|fim_suffix|>)<|fim_middle|>",
        "    def f(self):\n        return {'a': 1, \"b\": [2, 3]}\n\n\n\n",
        "x = 'don''t' + \"It's\" # ÄÖÜ äöü ß 你好世界 こんにちは 🤖🦀\n",
    ]
    texts = [t for t in TRICKY if t] + extra + code
    (out / "texts.json").write_text(json.dumps(texts, ensure_ascii=False))
    meta = GGUFFile(MODELS / SMOL).metadata
    _write_vocab_gguf(out / QWEN2_VOCAB, meta, **{"tokenizer.ggml.pre": "qwen2"})


def write_ids(out: Path) -> None:
    import llama_cpp

    texts = json.loads((out / "texts.json").read_text())
    result: dict[str, list[dict]] = {}
    for key, path in (
        (SMOL, MODELS / SMOL),
        (GEMMA, MODELS / GEMMA),
        (QWEN2_VOCAB, out / QWEN2_VOCAB),
    ):
        llm = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
        cases = []
        for text in texts:
            for special in (True, False):
                ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=special)
                cases.append({"text": text, "parse_special": special, "ids": list(ids)})
        result[key] = cases
    target = Path(__file__).with_name("data") / "llamacpp-tokenizer.json"
    generator = f"llama.cpp via llama-cpp-python {llama_cpp.__version__}, vocab_only"
    target.write_text(json.dumps({"generator": generator, "models": result}, ensure_ascii=False))


if __name__ == "__main__":
    {"texts": write_texts, "ids": write_ids}[sys.argv[1]](Path(sys.argv[2]))

"""Where bench decode's plain tok/s goes on CUDA: graph capture per fresh cache or not.

    python3 -m tools.cuda.decode_probe MODEL.gguf

Generates the bench-decode prompt with a throwaway session (a new KV cache, so new
graphs: what ``bench decode`` measures) and with a named session (its cache and
graphs kept: what an editor's session sees after its first request).
"""

from __future__ import annotations

import sys

from echoline.engine.api import Engine
from echoline.engine.bench.decode import PROMPT


def main(path: str) -> None:
    eng = Engine.load(path, backend="cuda")
    ids = eng.encode(PROMPT)
    eng.generate(ids, max_tokens=4, spec=False)
    for label, session in (("throwaway", None), ("named", "s")):
        for max_tokens in (64, 64, 64, 256):
            res = eng.generate(ids, max_tokens=max_tokens, spec=False, stop=(), session=session)
            st = res.stats
            print(
                f"{label:9s} max {max_tokens:3d}: {st.generated_tokens} tok, decode {st.decode_s * 1e3:.1f} ms,"
                f" {st.tokens_per_s:.1f} tok/s",
                flush=True,
            )


if __name__ == "__main__":
    main(sys.argv[1])

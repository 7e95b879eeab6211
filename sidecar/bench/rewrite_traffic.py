"""``bench spec --traffic rewrite``: the editor's rewrite command as benchmark requests.

Why here and not in the engine's benchmark: the requests go through the sidecar's own
rewrite prompt (``prompts.fitted_rewrite_ids``: the file as context, the selection, the
instruction, the reply primed with a code fence), and the engine knows nothing of the
sidecar's prompts. Each source is cut as ``edit`` traffic cuts it (its first ~3,500
characters), a function is selected (``traffic.function_span``) and the ``i``-th request
carries ``edit``'s ``i``-th instruction (the rename where no function was found), so the two traffics differ only in the prompt:
chat form with the whole excerpt and free prose, or the product's rewrite of a selection.
"""

from __future__ import annotations

from pathlib import Path

from echoline.engine.bench import traffic
from echoline.sidecar.engine_like import EngineLike
from echoline.sidecar.prompts import fitted_rewrite_ids


def rewrite_requests(engine: EngineLike, paths: list[Path], max_tokens: int = 256) -> list[tuple[list[int], tuple[str, ...]]]:
    """(prompt ids, stop strings) per source: what ``echoline rewrite`` would send the engine."""
    out = []
    for i, path in enumerate(paths):
        code = traffic.excerpt(path)
        start, end = traffic.function_span(code)
        selection = code[start:end]
        # A selection with no function (a source whose excerpt has none) gets the rename,
        # the one instruction that does not name a function.
        has_function = any(w in selection for w in ("def ", "class "))
        instruction = traffic.edit_instruction(i if has_function else 0, selection)
        prompt, ids = fitted_rewrite_ids(engine, code, start, end, instruction, name=path.name,
                                         reply_room=min(max_tokens, 1024))
        out.append((ids, (prompt.fence,)))
    return out

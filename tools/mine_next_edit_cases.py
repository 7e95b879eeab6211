"""Mine next-edit benchmark cases from a repository's history (``echoline bench next-edit``).

A case is a commit whose diff of one file repeats a change: its first two changed hunks
make the same minimal substitution (a rename, ``print`` -> ``log.info``, an added
``await``). The case replays the first hunk as the user's edit (``didChange``), puts the
cursor at its end, and expects the second hunk as the next edit. Only second hunks within
``--reach`` lines of the cursor are kept (an editable region of that size can reach them).

The stored file is a window of ``--window`` lines around the cursor (the prompt never
reads further), with the window's first line number, so each case stays small.

Usage (a bare git directory, e.g. one the ``fetch`` tool brought):
    python -m tools.mine_next_edit_cases REPO_GIT_DIR --repo owner/name --licence MIT \\
        [--max 40] >> cases.jsonl
then merge into ``sidecar/bench/data/next_edit_cases.json`` with ``--merge``.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from echoline.sidecar.edit_history import changed_span


def git(gitdir: str, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", gitdir, *args], check=True, capture_output=True,
                          text=True, errors="replace").stdout


def hunks(old: list[str], new: list[str]) -> list[tuple[int, int, int, int]]:
    """Changed line groups (i1, i2, j1, j2) of old -> new."""
    sm = difflib.SequenceMatcher(None, old, new, autojunk=False)
    return [(i1, i2, j1, j2) for tag, i1, i2, j1, j2 in sm.get_opcodes() if tag != "equal"]


def substitution(old_part: str, new_part: str) -> tuple[str, str] | None:
    span = changed_span(old_part, new_part)
    if span is None:
        return None
    s, oe, ne, _ = span
    return old_part[s:oe], new_part[s:ne]


def cases_of_commit(gitdir: str, sha: str, path: str, reach: int, window: int) -> list[dict[str, Any]]:
    try:
        before = git(gitdir, "show", f"{sha}^:{path}")
        after = git(gitdir, "show", f"{sha}:{path}")
    except subprocess.CalledProcessError:
        return []
    if len(before) > 200_000 or "\r" in before:
        return []
    old, new = before.splitlines(keepends=True), after.splitlines(keepends=True)
    hs = hunks(old, new)
    if not 2 <= len(hs) <= 12:
        return []
    small = [h for h in hs[:2] if h[1] - h[0] <= 3 and h[3] - h[2] <= 3]
    if len(small) < 2:
        return []
    (a1, a2, b1, b2), (c1, c2, d1, d2) = hs[0], hs[1]
    s1 = substitution("".join(old[a1:a2]), "".join(new[b1:b2]))
    s2 = substitution("".join(old[c1:c2]), "".join(new[d1:d2]))
    if s1 is None or s2 is None or s1 != s2 or not (s1[0].strip() or s1[1].strip()):
        return []
    if len(s1[0]) > 200 or len(s1[1]) > 200:
        return []
    # the state after the first hunk only: new lines for hunk 1, old lines elsewhere
    state1_lines = old[:a1] + new[b1:b2] + old[a2:]
    state2_lines = old[:a1] + new[b1:b2] + old[a2:c1] + new[d1:d2] + old[c2:]
    shift = (b2 - b1) - (a2 - a1)
    cursor_line = max(a1, a1 + (b2 - b1) - 1)  # the last line the first edit wrote
    if abs((c1 + shift) - cursor_line) > reach:
        return []
    lo = max(0, cursor_line - window)
    hi_state1 = min(len(state1_lines), cursor_line + window)
    hi_state2 = hi_state1 + (len(state2_lines) - len(state1_lines))
    before_win = "".join(old[lo : hi_state1 - shift])
    state1 = "".join(state1_lines[lo:hi_state1])
    state2 = "".join(state2_lines[lo:hi_state2])
    # the cursor: the end of the first edit's changed characters
    span = changed_span(before_win, state1)
    if span is None or changed_span(state1, state2) is None:
        return []
    cursor = span[2]
    return [{
        "before": before_win, "edited": state1, "expected": state2, "cursor": cursor,
        "path": path, "first_line": lo, "substitution": list(s1),
    }]


def mine(gitdir: str, repo: str, licence: str, max_cases: int, reach: int, window: int,
         ext: str) -> list[dict[str, Any]]:  # fmt: skip
    log = git(gitdir, "log", "--no-merges", "--format=%H", "--diff-filter=M", "--", f"*{ext}")
    out: list[dict[str, Any]] = []
    for sha in log.split():
        files = git(gitdir, "show", "--format=", "--name-only", "--diff-filter=M", sha).split()
        for path in files:
            if not path.endswith(ext):
                continue
            for case in cases_of_commit(gitdir, sha, path, reach, window):
                h = hashlib.sha1(f"{repo}{sha}".encode()).hexdigest()
                case.update(id=f"{repo.split('/')[-1]}-{sha[:10]}-{len(out)}", repo=repo, commit=sha,
                            licence=licence, split="tune" if int(h[:2], 16) % 2 == 0 else "heldout")
                out.append(case)
                break
        if len(out) >= max_cases:
            break
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("gitdir")
    p.add_argument("--repo", required=True, help="owner/name, recorded per case")
    p.add_argument("--licence", required=True, help="the repository's licence, recorded per case")
    p.add_argument("--max", type=int, default=40)
    p.add_argument("--reach", type=int, default=8, help="largest line distance cursor -> second hunk")
    p.add_argument("--window", type=int, default=60, help="lines kept around the cursor")
    p.add_argument("--ext", default=".py")
    p.add_argument("--merge", type=Path, default=None, help="add to this JSON case file instead of printing")
    a = p.parse_args(argv)
    cases = mine(a.gitdir, a.repo, a.licence, a.max, a.reach, a.window, a.ext)
    if a.merge is None:
        for c in cases:
            sys.stdout.write(json.dumps(c) + "\n")
        return 0
    data = json.loads(a.merge.read_text()) if a.merge.is_file() else {"cases": []}
    have = {c["id"] for c in data["cases"]}
    data["cases"] += [c for c in cases if c["id"] not in have]
    a.merge.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{len(cases)} cases mined, {len(data['cases'])} in {a.merge}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

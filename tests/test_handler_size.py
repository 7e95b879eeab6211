"""The LSP handlers in sidecar/server.py stay thin: at most ``MAX_LINES`` lines each.

Why: a handler parses its params, calls one function of a job module
(``rewrite_request``, ``inline_request``, ``next_edit_request``, ``status``, ...) and
converts the result. Logic that grows inside a handler can only be tested through a
running server; in its job module it is tested alone, and the server stays a map of
methods to jobs. Static (``ast``), so no server is started and every handler is seen,
whichever path registers it.

A handler is any function of server.py (module level or a method) named ``on_*`` or
``cmd_*``, any function decorated with ``.feature(...)`` / ``.command(...)``, and any
function registered as ``X.feature(...)(fn)`` / ``X.command(...)(fn)`` (how
``create_server`` registers them). Its length runs from its first decorator (or ``def``)
to its last line, docstring included.
"""

from __future__ import annotations

import ast
from pathlib import Path

SERVER = Path(__file__).resolve().parent.parent / "sidecar" / "server.py"
MAX_LINES = 25
REGISTRARS = frozenset({"feature", "command"})

Function = ast.FunctionDef | ast.AsyncFunctionDef


def _is_registrar(node: ast.AST) -> bool:
    """``X.feature(...)`` or ``X.command(...)`` (a call that returns a registering decorator)."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in REGISTRARS)


def registered_names(tree: ast.AST) -> set[str]:
    """Names passed to a registrar's decorator by call: ``ls.feature(M)(on_x)`` -> on_x."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _is_registrar(node.func):
            names.update(arg.id for arg in node.args if isinstance(arg, ast.Name))
    return names


def handlers(tree: ast.AST) -> list[Function]:
    """Every function the module docstring calls a handler."""
    registered = registered_names(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if (node.name.startswith(("on_", "cmd_")) or node.name in registered
                or any(_is_registrar(d) for d in node.decorator_list)):
            found.append(node)
    return found


def length(fn: Function) -> int:
    first = min([fn.lineno, *(d.lineno for d in fn.decorator_list)])
    assert fn.end_lineno is not None
    return fn.end_lineno - first + 1


def test_every_handler_is_short() -> None:
    tree = ast.parse(SERVER.read_text(encoding="utf-8"), filename=str(SERVER))
    long = {fn.name: length(fn) for fn in handlers(tree) if length(fn) > MAX_LINES}
    assert not long, (f"handlers in {SERVER.name} over {MAX_LINES} lines (move their logic into "
                      f"the job module they belong to): {long}")


def test_the_walk_sees_the_handlers() -> None:
    """Guards the test itself: the handlers of the methods the server is known for are
    found, through each way of naming or registering them."""
    tree = ast.parse(SERVER.read_text(encoding="utf-8"), filename=str(SERVER))
    names = {fn.name for fn in handlers(tree)}
    assert {"on_inline_completion", "on_next_edit", "on_copilot_inline_edit", "on_code_action",
            "cmd_rewrite", "cmd_status"} <= names
    assert {"on_inline_completion", "cmd_rewrite", "cmd_status"} <= registered_names(tree)


def test_a_long_decorated_handler_is_caught() -> None:
    """A handler registered by decorator, with neither prefix, is measured too."""
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    tree = ast.parse(f"@server.feature('echoline/x')\nasync def explain(ls, params):\n{body}\n")
    (fn,) = handlers(tree)
    assert fn.name == "explain" and length(fn) == MAX_LINES + 2

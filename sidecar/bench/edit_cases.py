"""Instruction edits with checks that run the edited code: the rewrite benchmark's data.

Each case is a small, realistic file, a selected span (usually one function) and the
sentence a developer would type. A rewrite is scored by *running* ``check`` against the
edited file, not by comparing text, because many different replacements are correct:
the check accepts any of them as long as the instruction was carried out and the
behaviour is preserved (or fixed, for bug fixes). ``solution`` is one correct answer,
kept so the tests can prove each check passes on a good edit and fails on the
unedited file.

``split`` keeps a held-out third: tune prompts and decoding on "tune", report on
"heldout", so a gain is not just the benchmark being learned.

The multi-line refactors (several functions or a whole class in a 20-60-line file) are
data: ``edit_cases_multiline.toml`` beside this module, read by ``load_cases`` at import.

Only the standard library is imported so this module can be read, copied or loaded
anywhere without the engine.
"""

import textwrap
import tomllib
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class EditCase:
    id: str  # short unique slug, e.g. "py-rename-param"
    split: str  # "tune" or "heldout"
    language: str  # "python" | "javascript" | "bash"
    filename: str  # the file the edited source is written to
    source: str  # the whole file before the edit
    lines: tuple[int, int]  # the selected lines, 1-based inclusive (what the model rewrites)
    instruction: str  # what a developer would type
    check: str  # a program in `language`, run next to the edited file; exit 0 = pass
    solution: str  # a correct replacement for exactly the selected lines
    kind: str = "function"  # "function" (one function) or "multiline" (a multi-line refactor)


# Helpers shared by every Python check (prepended to it). The checks look at the code
# through ``ast`` rather than its text, so whitespace, quote style, comments and an
# added docstring never matter.
_PY_PRELUDE = r'''
import ast
import inspect
import sys
import typing


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def expect(cond, msg):
    if not cond:
        fail(msg)


def func_node(mod, name):
    """The def called ``name`` anywhere in the module's file (methods included)."""
    with open(mod.__file__, encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    fail(f"no function named {name}")


def has(node, *kinds):
    return any(isinstance(n, kinds) for n in ast.walk(node))


def loops(node):
    return has(node, ast.For, ast.AsyncFor, ast.While)


def calls(node, name):
    """Whether ``node`` calls ``name(...)`` or ``something.name(...)``."""
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            f = n.func
            if isinstance(f, ast.Name) and f.id == name:
                return True
            if isinstance(f, ast.Attribute) and f.attr == name:
                return True
    return False


def constants(node):
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant)]


def names(node):
    found = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    return found | {a.arg for a in ast.walk(node) if isinstance(a, ast.arg)}


def params(fn):
    return inspect.signature(fn).parameters


def raises(exc, fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except exc:
        return True
    except Exception as err:
        fail(f"{fn.__name__}{args} raised {type(err).__name__}: {err}, not {exc.__name__}")
    return False


def uses_fstring(node):
    """An f-string with a placeholder, and no % formatting or .format() left."""
    fstring = any(
        isinstance(n, ast.JoinedStr) and any(isinstance(v, ast.FormattedValue) for v in n.values)
        for n in ast.walk(node)
    )
    percent = any(
        isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod)
        and isinstance(n.left, ast.Constant) and isinstance(n.left.value, str)
        for n in ast.walk(node)
    )
    dot_format = any(isinstance(n, ast.Attribute) and n.attr == "format" for n in ast.walk(node))
    return fstring and not percent and not dot_format

'''

_JS_PRELUDE = r"""'use strict';
const assert = require('node:assert/strict');

// The parameter names in a function's declaration (defaults dropped).
function paramNames(fn) {
  const src = fn.toString();
  const open = src.indexOf('(');
  const close = src.indexOf(')', open);
  return src
    .slice(open + 1, close)
    .split(',')
    .map((p) => p.split('=')[0].trim())
    .filter(Boolean);
}

"""

_SH_PRELUDE = r"""fail() {
  echo "FAIL: $*"
  exit 1
}

"""

_PRELUDES = {"python": _PY_PRELUDE, "javascript": _JS_PRELUDE, "bash": _SH_PRELUDE}


def _text(block: str) -> str:
    """A triple-quoted block as file text: common indent and the leading newline removed."""
    return textwrap.dedent(block).lstrip("\n")


def _span(source: str, select: str, language: str) -> tuple[int, int]:
    """1-based line range of the block whose first line starts with ``select``.

    Computed rather than typed by hand so a case cannot silently select the wrong lines:
    a Python block runs while lines are indented deeper than its ``def``; a JavaScript or
    bash block ends at the ``}`` with the header's indent.
    """
    lines = source.split("\n")
    starts = [i for i, line in enumerate(lines) if line.lstrip().startswith(select)]
    if len(starts) != 1:
        raise ValueError(f"{select!r} starts {len(starts)} lines, need exactly one")
    start = starts[0]
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = start
    for j in range(start + 1, len(lines)):
        line = lines[j]
        if language == "python":
            if not line.strip():
                continue
            if len(line) - len(line.lstrip()) <= indent:
                break
            end = j
        elif line.rstrip() == " " * indent + "}":
            end = j
            break
    else:
        if language != "python":
            raise ValueError(f"no closing brace for {select!r}")
    return start + 1, end + 1


def _case(
    slug: str,
    split: str,
    language: str,
    filename: str,
    source: str,
    select: str,
    instruction: str,
    check: str,
    solution: str,
    indent: int = 0,
) -> EditCase:
    text = _text(source)
    return EditCase(
        id=slug,
        split=split,
        language=language,
        filename=filename,
        source=text,
        lines=_span(text, select, language),
        instruction=instruction,
        check=_PRELUDES[language] + _text(check),
        solution=textwrap.indent(_text(solution), " " * indent),
    )


_PYTHON = (
    # ---------------------------------------------------------------- renames
    _case(
        "py-rename-param", "tune", "python", "blend.py",
        r'''
        """Small interpolation helpers used by the colour picker."""


        def clamp(value, low, high):
            if value < low:
                return low
            if value > high:
                return high
            return value


        def lerp(a, b, t):
            t = clamp(t, 0.0, 1.0)
            return a + (b - a) * t


        def remap(value, in_low, in_high, out_low, out_high):
            span = in_high - in_low
            if span == 0:
                return out_low
            return lerp(out_low, out_high, (value - in_low) / span)
        ''',
        "def lerp(",
        "Rename the parameter t to weight.",
        r'''
        import blend

        expect(blend.lerp(0, 10, 0.5) == 5, "lerp(0, 10, 0.5) != 5")
        expect(blend.lerp(2, 4, weight=3) == 4, "weight is no longer clamped")
        expect(blend.remap(5, 0, 10, 0, 100) == 50, "remap changed")
        expect("weight" in params(blend.lerp), f"parameters are {list(params(blend.lerp))}")
        expect("t" not in params(blend.lerp), "parameter t is still there")
        ''',
        r'''
        def lerp(a, b, weight):
            weight = clamp(weight, 0.0, 1.0)
            return a + (b - a) * weight
        ''',
    ),
    _case(
        "py-rename-var", "heldout", "python", "invoicing.py",
        r'''
        """Invoice arithmetic for the billing export."""

        from decimal import Decimal

        CURRENCY = "EUR"


        def subtotal(lines):
            tmp = 0
            for qty, unit_price in lines:
                tmp += qty * unit_price
            return round(tmp, 2)


        def format_amount(amount):
            return f"{Decimal(str(amount)):.2f} {CURRENCY}"
        ''',
        "def subtotal(",
        "Rename the variable tmp to total.",
        r'''
        import invoicing

        expect(invoicing.subtotal([(2, 1.5), (1, 0.25)]) == 3.25, "subtotal changed")
        expect(invoicing.subtotal([]) == 0, "subtotal([]) changed")
        expect(invoicing.format_amount(3.5) == "3.50 EUR", "format_amount changed")
        found = names(func_node(invoicing, "subtotal"))
        expect("total" in found, "no variable named total")
        expect("tmp" not in found, "tmp is still used")
        ''',
        r'''
        def subtotal(lines):
            total = 0
            for qty, unit_price in lines:
                total += qty * unit_price
            return round(total, 2)
        ''',
    ),
    # ------------------------------------------------------------- type hints
    _case(
        "py-hints-mean", "tune", "python", "grades.py",
        r'''
        """Grade book statistics."""

        PASS_MARK = 50


        def mean(values):
            if not values:
                return 0.0
            return sum(values) / len(values)


        def passed(scores):
            return [name for name, score in scores.items() if score >= PASS_MARK]


        def summary(scores):
            return {"mean": mean(list(scores.values())), "passed": len(passed(scores))}
        ''',
        "def mean(",
        "Add type hints to mean.",
        r'''
        import grades

        expect(grades.mean([1, 2, 3]) == 2.0, "mean([1, 2, 3]) != 2.0")
        expect(grades.mean([]) == 0.0, "mean([]) != 0.0")
        expect(grades.summary({"a": 40, "b": 60}) == {"mean": 50.0, "passed": 1}, "summary")
        hints = typing.get_type_hints(grades.mean)
        expect({"values", "return"} <= set(hints), f"type hints are {hints}")
        ''',
        r'''
        def mean(values: list[float]) -> float:
            if not values:
                return 0.0
            return sum(values) / len(values)
        ''',
    ),
    _case(
        "py-hints-port", "heldout", "python", "netcfg.py",
        r'''
        """Reads the listen address from the environment."""

        import os


        def parse_port(value, default=8080):
            value = value.strip()
            if not value:
                return default
            port = int(value)
            if not 0 < port < 65536:
                raise ValueError(f"port out of range: {port}")
            return port


        def listen_address():
            host = os.environ.get("APP_HOST", "127.0.0.1")
            return host, parse_port(os.environ.get("APP_PORT", ""))
        ''',
        "def parse_port(",
        "Add type hints to this function.",
        r'''
        import netcfg

        expect(netcfg.parse_port(" 9000 ") == 9000, "parse_port(' 9000 ') != 9000")
        expect(netcfg.parse_port("") == 8080, "the default changed")
        expect(netcfg.parse_port("", 1) == 1, "the default is ignored")
        expect(raises(ValueError, netcfg.parse_port, "70000"), "70000 accepted")
        hints = typing.get_type_hints(netcfg.parse_port)
        expect({"value", "default", "return"} <= set(hints), f"type hints are {hints}")
        ''',
        r'''
        def parse_port(value: str, default: int = 8080) -> int:
            value = value.strip()
            if not value:
                return default
            port = int(value)
            if not 0 < port < 65536:
                raise ValueError(f"port out of range: {port}")
            return port
        ''',
    ),
    _case(
        "py-hints-method", "tune", "python", "cart.py",
        r'''
        """Shopping cart kept in the session."""


        class Cart:
            def __init__(self):
                self.items = {}

            def add(self, name, qty=1):
                if qty <= 0:
                    raise ValueError("qty must be positive")
                self.items[name] = self.items.get(name, 0) + qty
                return self.items[name]

            def total_quantity(self):
                return sum(self.items.values())
        ''',
        "def add(",
        "Add type hints to add.",
        r'''
        import cart

        c = cart.Cart()
        expect(c.add("apple") == 1, "add('apple') != 1")
        expect(c.add("apple", 2) == 3, "quantities are not summed")
        expect(raises(ValueError, c.add, "pear", 0), "qty 0 accepted")
        expect(c.total_quantity() == 3, "total_quantity changed")
        hints = typing.get_type_hints(cart.Cart.add)
        expect({"name", "qty", "return"} <= set(hints), f"type hints are {hints}")
        ''',
        r'''
        def add(self, name: str, qty: int = 1) -> int:
            if qty <= 0:
                raise ValueError("qty must be positive")
            self.items[name] = self.items.get(name, 0) + qty
            return self.items[name]
        ''',
        indent=4,
    ),
    # -------------------------------------------------------------- f-strings
    _case(
        "py-fstring-percent", "tune", "python", "stockreport.py",
        r'''
        """Plain-text stock report for the warehouse dashboard."""


        def stock_line(item):
            name = item["name"]
            count = item["count"]
            if count == 0:
                return "%s: out of stock" % name
            return "%s: %d in stock (%.2f each)" % (name, count, item["price"])


        def report(items):
            lines = [stock_line(item) for item in items]
            return "\n".join(lines)
        ''',
        "def stock_line(",
        "Convert the % formatting to f-strings.",
        r'''
        import stockreport

        got = stockreport.stock_line({"name": "bolt", "count": 3, "price": 0.5})
        expect(got == "bolt: 3 in stock (0.50 each)", f"got {got!r}")
        got = stockreport.stock_line({"name": "nut", "count": 0, "price": 1})
        expect(got == "nut: out of stock", f"got {got!r}")
        expect(uses_fstring(func_node(stockreport, "stock_line")), "not f-strings yet")
        ''',
        r'''
        def stock_line(item):
            name = item["name"]
            count = item["count"]
            if count == 0:
                return f"{name}: out of stock"
            return f"{name}: {count} in stock ({item['price']:.2f} each)"
        ''',
    ),
    _case(
        "py-fstring-format", "heldout", "python", "buildtiming.py",
        r'''
        """Human-readable durations for the build log."""

        import time


        def describe(label, seconds):
            if seconds < 1:
                return "{}: {:.0f} ms".format(label, seconds * 1000)
            return "{}: {:.2f} s".format(label, seconds)


        class Stopwatch:
            def __init__(self, label):
                self.label = label
                self.started = time.perf_counter()

            def stop(self):
                return describe(self.label, time.perf_counter() - self.started)
        ''',
        "def describe(",
        "Use f-strings instead of .format().",
        r'''
        import buildtiming

        got = buildtiming.describe("load", 0.25)
        expect(got == "load: 250 ms", f"got {got!r}")
        got = buildtiming.describe("link", 2)
        expect(got == "link: 2.00 s", f"got {got!r}")
        expect(uses_fstring(func_node(buildtiming, "describe")), "not f-strings yet")
        ''',
        r'''
        def describe(label, seconds):
            if seconds < 1:
                return f"{label}: {seconds * 1000:.0f} ms"
            return f"{label}: {seconds:.2f} s"
        ''',
    ),
    # --------------------------------------------------------- guard clauses
    _case(
        "py-guard-empty", "tune", "python", "latency.py",
        r'''
        """Latency statistics for the health endpoint."""


        def average(samples):
            total = 0.0
            for s in samples:
                total += s
            return total / len(samples)


        def percentile(samples, pct):
            ordered = sorted(samples)
            index = min(len(ordered) - 1, int(len(ordered) * pct / 100))
            return ordered[index]


        def summarize(samples):
            return {"avg": average(samples), "p95": percentile(samples, 95)}
        ''',
        "def average(",
        "Raise a ValueError if samples is empty.",
        r'''
        import latency

        expect(raises(ValueError, latency.average, []), "average([]) did not raise")
        expect(latency.average([1, 2, 3]) == 2.0, "average([1, 2, 3]) != 2.0")
        expect(latency.average((4,)) == 4.0, "average((4,)) != 4.0")
        expect(latency.summarize([1, 3]) == {"avg": 2.0, "p95": 3}, "summarize changed")
        ''',
        r'''
        def average(samples):
            if not samples:
                raise ValueError("samples must not be empty")
            total = 0.0
            for s in samples:
                total += s
            return total / len(samples)
        ''',
    ),
    _case(
        "py-guard-negative", "heldout", "python", "ringbuf.py",
        r'''
        """A fixed-size ring buffer kept as a plain dict (it is saved as JSON)."""


        def make_ring(size, fill=0):
            slots = [fill] * size
            return {"slots": slots, "head": 0, "size": size}


        def push(ring, value):
            ring["slots"][ring["head"]] = value
            ring["head"] = (ring["head"] + 1) % ring["size"]
            return ring
        ''',
        "def make_ring(",
        "Raise ValueError when size is negative.",
        r'''
        import ringbuf

        expect(raises(ValueError, ringbuf.make_ring, -1), "make_ring(-1) did not raise")
        expect(ringbuf.make_ring(0) == {"slots": [], "head": 0, "size": 0}, "make_ring(0)")
        ring = ringbuf.make_ring(2, fill=None)
        expect(ring["slots"] == [None, None], "fill is ignored")
        expect(ringbuf.push(ring, 7)["slots"] == [7, None], "push changed")
        ''',
        r'''
        def make_ring(size, fill=0):
            if size < 0:
                raise ValueError(f"size must not be negative: {size}")
            slots = [fill] * size
            return {"slots": slots, "head": 0, "size": size}
        ''',
    ),
    _case(
        "py-guard-none", "tune", "python", "usernames.py",
        r'''
        """Turns display names into login handles."""

        RESERVED = {"admin", "root", "support"}


        def normalize(name):
            name = name.strip().lower()
            return "_".join(name.split())


        def is_available(name, taken):
            handle = normalize(name)
            return bool(handle) and handle not in RESERVED and handle not in taken
        ''',
        "def normalize(",
        "Return an empty string early if name is None.",
        r'''
        import usernames

        expect(usernames.normalize(None) == "", "normalize(None) is not ''")
        got = usernames.normalize("  Ada  Lovelace ")
        expect(got == "ada_lovelace", f"got {got!r}")
        expect(usernames.is_available("Root", set()) is False, "is_available changed")
        expect(usernames.is_available("Grace", {"ada"}) is True, "is_available changed")
        ''',
        r'''
        def normalize(name):
            if name is None:
                return ""
            name = name.strip().lower()
            return "_".join(name.split())
        ''',
    ),
    # --------------------------------------------------------- comprehensions
    _case(
        "py-listcomp", "tune", "python", "numberfilters.py",
        r'''
        """Number filters used by the quiz generator."""


        def even_squares(numbers):
            result = []
            for n in numbers:
                if n % 2 == 0:
                    result.append(n * n)
            return result


        def odd_numbers(numbers):
            return [n for n in numbers if n % 2]


        def quiz_values(limit):
            numbers = range(1, limit + 1)
            return even_squares(numbers) + odd_numbers(numbers)
        ''',
        "def even_squares(",
        "Rewrite this with a list comprehension.",
        r'''
        import numberfilters

        expect(numberfilters.even_squares([1, 2, 3, 4]) == [4, 16], "wrong result")
        expect(numberfilters.even_squares(range(5)) == [0, 4, 16], "wrong result on a range")
        expect(numberfilters.quiz_values(3) == [4, 1, 3], "quiz_values changed")
        node = func_node(numberfilters, "even_squares")
        expect(has(node, ast.ListComp), "no list comprehension")
        expect(not loops(node), "a loop statement is still there")
        ''',
        r'''
        def even_squares(numbers):
            return [n * n for n in numbers if n % 2 == 0]
        ''',
    ),
    _case(
        "py-dictcomp", "heldout", "python", "recordindex.py",
        r'''
        """In-memory lookup tables for the import job."""


        def index_by_id(records):
            by_id = {}
            for record in records:
                by_id[record["id"]] = record
            return by_id


        def missing_ids(records, wanted):
            known = index_by_id(records)
            return sorted(set(wanted) - set(known))
        ''',
        "def index_by_id(",
        "Use a dict comprehension here.",
        r'''
        import recordindex

        rows = [{"id": 1, "n": "a"}, {"id": 2, "n": "b"}, {"id": 1, "n": "c"}]
        got = recordindex.index_by_id(rows)
        expect(got == {1: rows[2], 2: rows[1]}, f"got {got!r}")
        expect(recordindex.index_by_id([]) == {}, "index_by_id([]) != {}")
        expect(recordindex.missing_ids(rows, [3, 1, 0]) == [0, 3], "missing_ids changed")
        node = func_node(recordindex, "index_by_id")
        expect(has(node, ast.DictComp), "no dict comprehension")
        expect(not loops(node), "a loop statement is still there")
        ''',
        r'''
        def index_by_id(records):
            return {record["id"]: record for record in records}
        ''',
    ),
    # ------------------------------------------------------------- docstrings
    _case(
        "py-docstring", "tune", "python", "slugs.py",
        r'''
        """URL helpers for the blog engine."""

        import re

        MAX_SLUG = 50


        def slugify(text, max_length=MAX_SLUG):
            text = text.lower()
            text = re.sub(r"[^a-z0-9]+", "-", text).strip("-")
            return text[:max_length].rstrip("-")


        def post_url(year, title):
            return f"/{year}/{slugify(title)}/"
        ''',
        "def slugify(",
        "Add a docstring.",
        r'''
        import slugs

        expect(slugs.slugify("Hello, World!") == "hello-world", "slugify changed")
        expect(slugs.slugify("a b c", max_length=4) == "a-b", "max_length changed")
        expect(slugs.post_url(2024, "New post") == "/2024/new-post/", "post_url changed")
        expect((slugs.slugify.__doc__ or "").strip(), "slugify has no docstring")
        ''',
        r'''
        def slugify(text, max_length=MAX_SLUG):
            """Lower-case ``text`` and join its alphanumeric runs with hyphens.

            The result is cut to ``max_length`` characters and never ends with a hyphen.
            """
            text = text.lower()
            text = re.sub(r"[^a-z0-9]+", "-", text).strip("-")
            return text[:max_length].rstrip("-")
        ''',
    ),
    _case(
        "py-docstring-chunk", "heldout", "python", "batching.py",
        r'''
        """Splits work into batches for the upload queue."""

        DEFAULT_BATCH = 25


        def chunk(items, size):
            if size < 1:
                raise ValueError("size must be at least 1")
            return [items[i:i + size] for i in range(0, len(items), size)]


        def batches(items, size=DEFAULT_BATCH):
            for part in chunk(list(items), size):
                yield part
        ''',
        "def chunk(",
        "Write a docstring for chunk that says what it returns.",
        r'''
        import batching

        got = batching.chunk([1, 2, 3, 4, 5], 2)
        expect(got == [[1, 2], [3, 4], [5]], f"got {got!r}")
        expect(batching.chunk([], 3) == [], "chunk([], 3) != []")
        expect(raises(ValueError, batching.chunk, [1], 0), "size 0 accepted")
        expect(list(batching.batches(range(3), 2)) == [[0, 1], [2]], "batches changed")
        expect((batching.chunk.__doc__ or "").strip(), "chunk has no docstring")
        ''',
        r'''
        def chunk(items, size):
            """Return ``items`` cut into consecutive lists of ``size`` (the last may be shorter)."""
            if size < 1:
                raise ValueError("size must be at least 1")
            return [items[i:i + size] for i in range(0, len(items), size)]
        ''',
    ),
    # -------------------------------------------------- constants and numbers
    _case(
        "py-extract-constant", "tune", "python", "pricing.py",
        r'''
        """Checkout totals."""

        CURRENCY = "GBP"


        def invoice_total(lines):
            net = sum(qty * price for qty, price in lines)
            tax = net * 0.2
            return round(net + tax, 2)


        def describe_total(lines):
            return f"{invoice_total(lines):.2f} {CURRENCY}"
        ''',
        "def invoice_total(",
        "Move the 0.2 tax rate into a module-level constant TAX_RATE.",
        r'''
        import pricing

        expect(pricing.invoice_total([(2, 5.0), (1, 2.5)]) == 15.0, "invoice_total changed")
        expect(pricing.describe_total([(1, 10)]) == "12.00 GBP", "describe_total changed")
        expect(getattr(pricing, "TAX_RATE", None) == 0.2, "no TAX_RATE = 0.2")
        expect(0.2 not in constants(func_node(pricing, "invoice_total")), "0.2 is still inline")
        pricing.TAX_RATE = 0.5
        expect(pricing.invoice_total([(2, 5.0)]) == 15.0, "TAX_RATE is not used")
        ''',
        r'''
        TAX_RATE = 0.2


        def invoice_total(lines):
            net = sum(qty * price for qty, price in lines)
            tax = net * TAX_RATE
            return round(net + tax, 2)
        ''',
    ),
    _case(
        "py-magic-number", "heldout", "python", "expiry.py",
        r'''
        """Licence expiry checks."""

        import time


        def days_left(expires_at, now=None):
            if now is None:
                now = time.time()
            remaining = expires_at - now
            if remaining <= 0:
                return 0
            return int(remaining // 86400)


        def is_expiring_soon(expires_at, warn_days=14):
            return days_left(expires_at) <= warn_days
        ''',
        "def days_left(",
        "Replace the magic number 86400 with a SECONDS_PER_DAY constant.",
        r'''
        import expiry

        expect(expiry.days_left(86400 * 3 + 5, 0) == 3, "days_left changed")
        expect(expiry.days_left(5, 10) == 0, "days_left of the past is not 0")
        expect(expiry.is_expiring_soon(0) is True, "is_expiring_soon changed")
        expect(getattr(expiry, "SECONDS_PER_DAY", None) == 86400, "no SECONDS_PER_DAY = 86400")
        expect(86400 not in constants(func_node(expiry, "days_left")), "86400 is still inline")
        expiry.SECONDS_PER_DAY = 10
        expect(expiry.days_left(100, 0) == 10, "SECONDS_PER_DAY is not used")
        ''',
        r'''
        SECONDS_PER_DAY = 86400


        def days_left(expires_at, now=None):
            if now is None:
                now = time.time()
            remaining = expires_at - now
            if remaining <= 0:
                return 0
            return int(remaining // SECONDS_PER_DAY)
        ''',
    ),
    # ------------------------------------------------------ loops to builtins
    _case(
        "py-sum", "tune", "python", "parcels.py",
        r'''
        """Shipping weight calculations."""

        MAX_WEIGHT_KG = 30


        def total_weight(parcels):
            total = 0
            for parcel in parcels:
                total += parcel["weight"]
            return total


        def needs_freight(parcels):
            return total_weight(parcels) > MAX_WEIGHT_KG
        ''',
        "def total_weight(",
        "Use sum() instead of the loop.",
        r'''
        import parcels

        expect(parcels.total_weight([{"weight": 2}, {"weight": 3.5}]) == 5.5, "wrong total")
        expect(parcels.total_weight([]) == 0, "total_weight([]) != 0")
        expect(parcels.needs_freight([{"weight": 31}]) is True, "needs_freight changed")
        node = func_node(parcels, "total_weight")
        expect(calls(node, "sum"), "sum() is not used")
        expect(not loops(node), "a loop statement is still there")
        ''',
        r'''
        def total_weight(parcels):
            return sum(parcel["weight"] for parcel in parcels)
        ''',
    ),
    _case(
        "py-any", "tune", "python", "perms.py",
        r'''
        """Document permissions."""


        def can_edit(user, document):
            for role in user["roles"]:
                if role in document["editors"]:
                    return True
            return False


        def can_view(user, document):
            return document["public"] or can_edit(user, document)
        ''',
        "def can_edit(",
        "Simplify this with any().",
        r'''
        import perms

        doc = {"editors": {"owner", "writer"}, "public": False}
        expect(perms.can_edit({"roles": ["reader", "writer"]}, doc) is True, "writer can't edit")
        expect(perms.can_edit({"roles": ["reader"]}, doc) is False, "reader can edit")
        expect(perms.can_edit({"roles": []}, doc) is False, "no roles can edit")
        expect(perms.can_view({"roles": []}, dict(doc, public=True)) is True, "can_view")
        node = func_node(perms, "can_edit")
        expect(calls(node, "any"), "any() is not used")
        expect(not loops(node), "a loop statement is still there")
        ''',
        r'''
        def can_edit(user, document):
            return any(role in document["editors"] for role in user["roles"])
        ''',
    ),
    _case(
        "py-max", "tune", "python", "wordstats.py",
        r'''
        """Word statistics for the editor's status bar."""


        def longest_word(words):
            best = words[0]
            for word in words[1:]:
                if len(word) > len(best):
                    best = word
            return best


        def average_length(words):
            return sum(len(w) for w in words) / len(words)
        ''',
        "def longest_word(",
        "Use max() with a key instead of the manual loop.",
        r'''
        import wordstats

        got = wordstats.longest_word(["hi", "there", "world"])
        expect(got == "there", f"got {got!r} (ties must keep the first)")
        expect(wordstats.longest_word(["a"]) == "a", "one word")
        expect(wordstats.average_length(["ab", "abcd"]) == 3, "average_length changed")
        node = func_node(wordstats, "longest_word")
        expect(calls(node, "max"), "max() is not used")
        expect(not loops(node), "a loop statement is still there")
        ''',
        r'''
        def longest_word(words):
            return max(words, key=len)
        ''',
    ),
    _case(
        "py-enumerate", "tune", "python", "numbering.py",
        r'''
        """Line numbering for code snippets in the docs."""


        def numbered(lines, start=1):
            out = []
            for i in range(len(lines)):
                out.append(f"{i + start}: {lines[i]}")
            return out


        def render(snippet):
            return "\n".join(numbered(snippet.splitlines()))
        ''',
        "def numbered(",
        "Use enumerate instead of range(len(lines)).",
        r'''
        import numbering

        expect(numbering.numbered(["a", "b"]) == ["1: a", "2: b"], "numbered changed")
        expect(numbering.numbered(["x"], start=0) == ["0: x"], "start is ignored")
        expect(numbering.numbered([]) == [], "numbered([]) != []")
        expect(numbering.render("p\nq") == "1: p\n2: q", "render changed")
        node = func_node(numbering, "numbered")
        expect(calls(node, "enumerate"), "enumerate() is not used")
        expect(not calls(node, "range"), "range() is still used")
        ''',
        r'''
        def numbered(lines, start=1):
            out = []
            for i, line in enumerate(lines, start):
                out.append(f"{i}: {line}")
            return out
        ''',
    ),
    _case(
        "py-zip", "heldout", "python", "scoreboard.py",
        r'''
        """Scoreboard helpers for the quiz app."""


        def pair_scores(names, scores):
            board = {}
            for i in range(len(names)):
                board[names[i]] = scores[i]
            return board


        def winner(names, scores):
            board = pair_scores(names, scores)
            return max(board, key=board.get)
        ''',
        "def pair_scores(",
        "Use zip to pair the names with the scores.",
        r'''
        import scoreboard

        got = scoreboard.pair_scores(["ann", "bob"], [3, 5])
        expect(got == {"ann": 3, "bob": 5}, f"got {got!r}")
        expect(scoreboard.pair_scores([], []) == {}, "empty board")
        expect(scoreboard.winner(["ann", "bob", "cy"], [3, 9, 4]) == "bob", "winner changed")
        node = func_node(scoreboard, "pair_scores")
        expect(calls(node, "zip"), "zip() is not used")
        expect(not calls(node, "range"), "range() is still used")
        ''',
        r'''
        def pair_scores(names, scores):
            board = {}
            for name, score in zip(names, scores):
                board[name] = score
            return board
        ''',
    ),
    _case(
        "py-with-open", "tune", "python", "settingsfile.py",
        r'''
        """Loads key=value settings files."""

        import os

        DEFAULT_PATH = os.path.expanduser("~/.demo.cfg")


        def read_settings(path):
            f = open(path, encoding="utf-8")
            settings = {}
            for line in f:
                line = line.strip()
                if line and not line.startswith("#"):
                    key, _, value = line.partition("=")
                    settings[key.strip()] = value.strip()
            f.close()
            return settings


        def load(path=None):
            return read_settings(path or DEFAULT_PATH)
        ''',
        "def read_settings(",
        "Open the file with a with statement.",
        r'''
        import settingsfile

        opened = []
        real_open = open


        def tracking_open(*args, **kwargs):
            handle = real_open(*args, **kwargs)
            opened.append(handle)
            return handle


        with real_open("app.cfg", "w", encoding="utf-8") as fh:
            fh.write("# comment\nname = demo\n\nport=8000\n")
        settingsfile.open = tracking_open
        got = settingsfile.load("app.cfg")
        expect(got == {"name": "demo", "port": "8000"}, f"got {got!r}")
        expect(all(h.closed for h in opened), "the file is left open")
        expect(has(func_node(settingsfile, "read_settings"), ast.With), "no with statement")
        ''',
        r'''
        def read_settings(path):
            settings = {}
            with open(path, encoding="utf-8") as f:
                for line in f:
                    line = line.strip()
                    if line and not line.startswith("#"):
                        key, _, value = line.partition("=")
                        settings[key.strip()] = value.strip()
            return settings
        ''',
    ),
    # ------------------------------------------------------------ off-by-ones
    _case(
        "py-off-by-one-slice", "tune", "python", "history.py",
        r'''
        """Command history for the REPL."""

        MAX_HISTORY = 500


        def last_n(items, n):
            if n <= 0:
                return []
            return items[len(items) - n - 1:]


        def recent_commands(history, n=10):
            return [cmd for cmd in last_n(history, n) if cmd.strip()]
        ''',
        "def last_n(",
        "Fix the off-by-one: last_n returns one item too many.",
        r'''
        import history

        got = history.last_n([1, 2, 3, 4], 2)
        expect(got == [3, 4], f"last_n([1, 2, 3, 4], 2) gave {got!r}")
        got = history.last_n([1, 2, 3], 3)
        expect(got == [1, 2, 3], f"last_n([1, 2, 3], 3) gave {got!r}")
        expect(history.last_n([1, 2], 0) == [], "last_n(..., 0) != []")
        got = history.recent_commands(["ls", " ", "pwd"], 2)
        expect(got == ["pwd"], f"recent_commands gave {got!r}")
        ''',
        r'''
        def last_n(items, n):
            if n <= 0:
                return []
            return items[len(items) - n:]
        ''',
    ),
    _case(
        "py-off-by-one-range", "heldout", "python", "series.py",
        r'''
        """Number series for the maths worksheet generator."""


        def triangular(n):
            total = 0
            for k in range(1, n):
                total += k
            return total


        def triangular_series(count):
            return [triangular(i) for i in range(1, count + 1)]
        ''',
        "def triangular(",
        "triangular(n) should include n itself; fix the off-by-one.",
        r'''
        import series

        expect(series.triangular(4) == 10, f"triangular(4) gave {series.triangular(4)}")
        expect(series.triangular(1) == 1, "triangular(1) != 1")
        expect(series.triangular(0) == 0, "triangular(0) != 0")
        expect(series.triangular_series(3) == [1, 3, 6], "triangular_series is wrong")
        ''',
        r'''
        def triangular(n):
            total = 0
            for k in range(1, n + 1):
                total += k
            return total
        ''',
    ),
    # ------------------------------------------------ defaults and parameters
    _case(
        "py-default-timeout", "tune", "python", "httpopts.py",
        r'''
        """Request options for the webhook sender."""

        USER_AGENT = "demo-hooks/1.2"


        def request_options(url, timeout=30, retries=2):
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"not an http url: {url}")
            return {"url": url, "timeout": timeout, "retries": retries}


        def headers(token):
            return {"User-Agent": USER_AGENT, "Authorization": f"Bearer {token}"}
        ''',
        "def request_options(",
        "Change the default timeout to 10.",
        r'''
        import httpopts

        opts = httpopts.request_options("https://example.test/hook")
        expect(opts == {"url": "https://example.test/hook", "timeout": 10, "retries": 2},
               f"got {opts!r}")
        expect(httpopts.request_options("http://x", timeout=5)["timeout"] == 5, "timeout ignored")
        expect(raises(ValueError, httpopts.request_options, "ftp://x"), "ftp accepted")
        expect(params(httpopts.request_options)["timeout"].default == 10, "default is not 10")
        ''',
        r'''
        def request_options(url, timeout=10, retries=2):
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"not an http url: {url}")
            return {"url": url, "timeout": timeout, "retries": retries}
        ''',
    ),
    _case(
        "py-default-sep", "heldout", "python", "tsvsplit.py",
        r'''
        """Splits exported records into fields."""

        EXPORT_VERSION = 3


        def split_record(line, sep=","):
            fields = line.rstrip("\n").split(sep)
            return [field.strip() for field in fields]


        def read_records(lines, sep=","):
            return [split_record(line, sep) for line in lines if line.strip()]
        ''',
        "def split_record(",
        "Make tab the default separator for split_record.",
        r'''
        import tsvsplit

        expect(tsvsplit.split_record("a\t b\n") == ["a", "b"], "tab split is wrong")
        expect(tsvsplit.split_record("a,b", sep=",") == ["a", "b"], "sep is ignored")
        expect(tsvsplit.read_records(["x,y\n", "\n"]) == [["x", "y"]], "read_records changed")
        expect(params(tsvsplit.split_record)["sep"].default == "\t", "default is not a tab")
        ''',
        r'''
        def split_record(line, sep="\t"):
            fields = line.rstrip("\n").split(sep)
            return [field.strip() for field in fields]
        ''',
    ),
    _case(
        "py-add-param", "tune", "python", "namelist.py",
        r'''
        """Formats lists of people for email footers."""


        def join_names(names):
            cleaned = [n.strip() for n in names if n.strip()]
            return ", ".join(cleaned)


        def footer(names):
            if not names:
                return ""
            return "Sent to: " + join_names(names)
        ''',
        "def join_names(",
        'Add a sep parameter that defaults to ", ".',
        r'''
        import namelist

        expect(namelist.join_names(["a", " b ", ""]) == "a, b", "default join changed")
        expect(namelist.join_names(["a", "b"], sep=" / ") == "a / b", "sep is ignored")
        expect(namelist.footer(["ann"]) == "Sent to: ann", "footer changed")
        sep = params(namelist.join_names).get("sep")
        expect(sep is not None and sep.default == ", ", "no sep parameter defaulting to ', '")
        ''',
        r'''
        def join_names(names, sep=", "):
            cleaned = [n.strip() for n in names if n.strip()]
            return sep.join(cleaned)
        ''',
    ),
)


_JAVASCRIPT = (
    _case(
        "js-rename-param", "tune", "javascript", "discount.js",
        r"""
        'use strict';

        const MAX_PERCENT = 90;

        function applyDiscount(price, pct) {
          const capped = Math.min(Math.max(pct, 0), MAX_PERCENT);
          const discounted = price * (1 - capped / 100);
          return Math.round(discounted * 100) / 100;
        }

        function formatPrice(amount) {
          return '$' + amount.toFixed(2);
        }

        module.exports = { applyDiscount, formatPrice, MAX_PERCENT };
        """,
        "function applyDiscount(",
        "Rename pct to percent.",
        r"""
        const m = require('./discount.js');

        assert.equal(m.applyDiscount(100, 25), 75);
        assert.equal(m.applyDiscount(80, 95), 8);
        assert.equal(m.applyDiscount(50, -5), 50);
        assert.equal(m.formatPrice(3), '$3.00');
        assert.deepEqual(paramNames(m.applyDiscount), ['price', 'percent']);
        """,
        r"""
        function applyDiscount(price, percent) {
          const capped = Math.min(Math.max(percent, 0), MAX_PERCENT);
          const discounted = price * (1 - capped / 100);
          return Math.round(discounted * 100) / 100;
        }
        """,
    ),
    _case(
        "js-template-literal", "heldout", "javascript", "banner.js",
        r"""
        'use strict';

        function pluralize(count, word) {
          return count === 1 ? word : word + 's';
        }

        function statusLine(user, unread) {
          const noun = pluralize(unread, 'message');
          return 'Hi ' + user.name + ', you have ' + unread + ' new ' + noun + '.';
        }

        module.exports = { pluralize, statusLine };
        """,
        "function statusLine(",
        "Use a template literal instead of string concatenation.",
        r"""
        const m = require('./banner.js');

        assert.equal(m.statusLine({ name: 'Ann' }, 1), 'Hi Ann, you have 1 new message.');
        assert.equal(m.statusLine({ name: 'Bo' }, 3), 'Hi Bo, you have 3 new messages.');
        assert.equal(m.pluralize(2, 'file'), 'files');
        const src = m.statusLine.toString();
        assert.ok(src.includes('`') && src.includes('${'), 'no template literal');
        assert.ok(!/['"]\s*\+|\+\s*['"]/.test(src), 'string concatenation is still there');
        """,
        r"""
        function statusLine(user, unread) {
          const noun = pluralize(unread, 'message');
          return `Hi ${user.name}, you have ${unread} new ${noun}.`;
        }
        """,
    ),
    _case(
        "js-guard-empty", "tune", "javascript", "mathstats.js",
        r"""
        'use strict';

        function average(values) {
          let sum = 0;
          for (const v of values) sum += v;
          return sum / values.length;
        }

        function spread(values) {
          return Math.max(...values) - Math.min(...values);
        }

        module.exports = { average, spread };
        """,
        "function average(",
        "Throw a RangeError when values is empty.",
        r"""
        const m = require('./mathstats.js');

        assert.throws(() => m.average([]), RangeError);
        assert.equal(m.average([2, 4]), 3);
        assert.equal(m.average([5]), 5);
        assert.equal(m.spread([3, 9, 1]), 8);
        """,
        r"""
        function average(values) {
          if (values.length === 0) {
            throw new RangeError('average of an empty list');
          }
          let sum = 0;
          for (const v of values) sum += v;
          return sum / values.length;
        }
        """,
    ),
    _case(
        "js-let-const", "tune", "javascript", "wordfreq.js",
        r"""
        'use strict';

        function wordFrequencies(text) {
          var counts = {};
          var words = text.toLowerCase().split(/\W+/);
          for (var i = 0; i < words.length; i++) {
            var w = words[i];
            if (!w) continue;
            counts[w] = (counts[w] || 0) + 1;
          }
          return counts;
        }

        function topWord(text) {
          const counts = wordFrequencies(text);
          return Object.keys(counts).sort((a, b) => counts[b] - counts[a])[0];
        }

        module.exports = { wordFrequencies, topWord };
        """,
        "function wordFrequencies(",
        "Replace var with let or const.",
        r"""
        const m = require('./wordfreq.js');

        assert.deepEqual(m.wordFrequencies('The cat saw the CAT.'), { the: 2, cat: 2, saw: 1 });
        assert.deepEqual(m.wordFrequencies(''), {});
        assert.equal(m.topWord('a b b'), 'b');
        assert.ok(!/\bvar\b/.test(m.wordFrequencies.toString()), 'var is still used');
        """,
        r"""
        function wordFrequencies(text) {
          const counts = {};
          const words = text.toLowerCase().split(/\W+/);
          for (let i = 0; i < words.length; i++) {
            const w = words[i];
            if (!w) continue;
            counts[w] = (counts[w] || 0) + 1;
          }
          return counts;
        }
        """,
    ),
    _case(
        "js-map", "tune", "javascript", "usersview.js",
        r"""
        'use strict';

        function displayNames(users) {
          const names = [];
          for (let i = 0; i < users.length; i++) {
            names.push(users[i].first + ' ' + users[i].last);
          }
          return names;
        }

        function initials(user) {
          return (user.first[0] + user.last[0]).toUpperCase();
        }

        module.exports = { displayNames, initials };
        """,
        "function displayNames(",
        "Use map instead of the for loop.",
        r"""
        const m = require('./usersview.js');

        const users = [{ first: 'Ada', last: 'Byron' }, { first: 'Alan', last: 'Turing' }];
        assert.deepEqual(m.displayNames(users), ['Ada Byron', 'Alan Turing']);
        assert.deepEqual(m.displayNames([]), []);
        assert.equal(m.initials(users[1]), 'AT');
        const src = m.displayNames.toString();
        assert.ok(src.includes('.map('), 'map is not used');
        assert.ok(!/\bfor\s*\(|\.forEach\(/.test(src), 'a loop is still there');
        """,
        r"""
        function displayNames(users) {
          return users.map((user) => user.first + ' ' + user.last);
        }
        """,
    ),
    _case(
        "js-off-by-one", "tune", "javascript", "adjacent.js",
        r"""
        'use strict';

        function pairs(list) {
          const out = [];
          for (let i = 0; i <= list.length - 1; i++) {
            out.push([list[i], list[i + 1]]);
          }
          return out;
        }

        function distances(points) {
          return pairs(points).map(([a, b]) => Math.abs(b - a));
        }

        module.exports = { pairs, distances };
        """,
        "function pairs(",
        "Fix the off-by-one: the last pair has undefined in it.",
        r"""
        const m = require('./adjacent.js');

        assert.deepEqual(m.pairs([1, 2, 3]), [[1, 2], [2, 3]]);
        assert.deepEqual(m.pairs([1]), []);
        assert.deepEqual(m.pairs([]), []);
        assert.deepEqual(m.distances([1, 4, 2]), [3, 2]);
        """,
        r"""
        function pairs(list) {
          const out = [];
          for (let i = 0; i < list.length - 1; i++) {
            out.push([list[i], list[i + 1]]);
          }
          return out;
        }
        """,
    ),
    _case(
        "js-add-param", "heldout", "javascript", "greeter.js",
        r"""
        'use strict';

        const DEFAULT_NAME = 'there';

        function greet(name) {
          const who = (name || '').trim() || DEFAULT_NAME;
          return `Hello, ${who}!`;
        }

        function farewell(name) {
          return `Bye, ${name}.`;
        }

        module.exports = { greet, farewell };
        """,
        "function greet(",
        "Add a greeting parameter that defaults to 'Hello'.",
        r"""
        const m = require('./greeter.js');

        assert.equal(m.greet('Ann'), 'Hello, Ann!');
        assert.equal(m.greet('Ann', 'Hi'), 'Hi, Ann!');
        assert.equal(m.greet(' '), 'Hello, there!');
        assert.equal(m.farewell('Bo'), 'Bye, Bo.');
        assert.ok(paramNames(m.greet).includes('greeting'), 'no greeting parameter');
        """,
        r"""
        function greet(name, greeting = 'Hello') {
          const who = (name || '').trim() || DEFAULT_NAME;
          return `${greeting}, ${who}!`;
        }
        """,
    ),
)


_BASH = (
    _case(
        "sh-guard-negative", "tune", "bash", "strutil.sh",
        r"""
        #!/usr/bin/env bash
        # String helpers shared by the release scripts.

        repeat_str() {
          local text=$1 count=$2 out=""
          local i
          for ((i = 0; i < count; i++)); do
            out+=$text
          done
          printf '%s\n' "$out"
        }

        upper() {
          printf '%s\n' "$1" | tr '[:lower:]' '[:upper:]'
        }

        if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
          repeat_str "$@"
        fi
        """,
        "repeat_str() {",
        "Print an error to stderr and return 1 if the count is negative.",
        r"""
        source ./strutil.sh || fail "could not source strutil.sh"
        out=$(repeat_str ab 3) || fail "repeat_str ab 3 failed"
        [[ $out == ababab ]] || fail "repeat_str ab 3 printed '$out'"
        out=$(repeat_str ab 0) || fail "repeat_str ab 0 failed"
        [[ -z $out ]] || fail "repeat_str ab 0 printed '$out'"
        if out=$(repeat_str ab -2 2>/dev/null); then
          fail "repeat_str ab -2 succeeded"
        fi
        [[ -z $out ]] || fail "repeat_str ab -2 printed '$out'"
        [[ $(upper abc) == ABC ]] || fail "upper changed"
        """,
        r"""
        repeat_str() {
          local text=$1 count=$2 out=""
          local i
          if ((count < 0)); then
            echo "repeat_str: count must not be negative: $count" >&2
            return 1
          fi
          for ((i = 0; i < count; i++)); do
            out+=$text
          done
          printf '%s\n' "$out"
        }
        """,
    ),
    _case(
        "sh-local-vars", "heldout", "bash", "counters.sh",
        r"""
        #!/usr/bin/env bash
        # Arithmetic helpers for the deploy scripts.

        sum_args() {
          total=0
          for n in "$@"; do
            total=$((total + n))
          done
          echo "$total"
        }

        max_arg() {
          local best=$1 n
          for n in "$@"; do
            if ((n > best)); then best=$n; fi
          done
          echo "$best"
        }
        """,
        "sum_args() {",
        "Make total and n local variables.",
        r"""
        source ./counters.sh || fail "could not source counters.sh"
        unset total n
        sum_args 1 2 3 > out.txt || fail "sum_args 1 2 3 failed"
        [[ $(< out.txt) == 6 ]] || fail "sum_args 1 2 3 printed '$(< out.txt)'"
        [[ -z ${total+set} ]] || fail "total leaks into the caller"
        [[ -z ${n+set} ]] || fail "n leaks into the caller"
        sum_args > out.txt || fail "sum_args with no arguments failed"
        [[ $(< out.txt) == 0 ]] || fail "sum_args with no arguments printed '$(< out.txt)'"
        [[ $(max_arg 3 9 2) == 9 ]] || fail "max_arg changed"
        """,
        r"""
        sum_args() {
          local total=0 n
          for n in "$@"; do
            total=$((total + n))
          done
          echo "$total"
        }
        """,
    ),
    _case(
        "sh-add-arg", "tune", "bash", "logtail.sh",
        r"""
        #!/usr/bin/env bash
        # Helpers for reading application logs during incidents.

        LOG_DIR=${LOG_DIR:-/var/log/app}

        recent_errors() {
          grep -i 'error' "$1" | tail -n 5
        }

        error_count() {
          grep -ci 'error' "$1"
        }

        if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
          recent_errors "${1:-$LOG_DIR/app.log}"
        fi
        """,
        "recent_errors() {",
        "Add an optional second argument for the number of lines, defaulting to 5.",
        r"""
        source ./logtail.sh || fail "could not source logtail.sh"
        for i in 1 2 3 4 5 6 7 8; do
          echo "ERROR number $i"
          echo "info $i"
        done > app.log
        [[ $(recent_errors app.log | wc -l) -eq 5 ]] || fail "the default is not 5 lines"
        out=$(recent_errors app.log 2)
        [[ $out == $'ERROR number 7\nERROR number 8' ]] || fail "recent_errors app.log 2: '$out'"
        [[ $(error_count app.log) -eq 8 ]] || fail "error_count changed"
        """,
        r"""
        recent_errors() {
          local count=${2:-5}
          grep -i 'error' "$1" | tail -n "$count"
        }
        """,
    ),
)


MULTILINE_FILE = Path(__file__).with_name("edit_cases_multiline.toml")
_CASE_KEYS = {"id", "split", "language", "filename", "source", "select", "through", "instruction",
              "check", "solution"}


def load_cases(path: Path, kind: str = "multiline") -> tuple[EditCase, ...]:
    """The ``[[case]]`` tables of a TOML file as EditCases (the file's header says the keys).

    The selection runs from the block that starts with ``select`` to the end of the block
    that starts with ``through`` (default: ``select``'s own), found as ``_span`` finds one.
    """
    with open(path, "rb") as fh:
        tables = tomllib.load(fh).get("case", [])
    cases = []
    for raw in tables:
        unknown = set(raw) - _CASE_KEYS
        if unknown:
            raise ValueError(f"{path.name}: case {raw.get('id')!r} has unknown keys {sorted(unknown)}")
        language = raw["language"]
        source = raw["source"]
        first, _ = _span(source, raw["select"], language)
        _, last = _span(source, raw.get("through", raw["select"]), language)
        cases.append(EditCase(
            id=raw["id"], split=raw["split"], language=language, filename=raw["filename"],
            source=source, lines=(first, last), instruction=raw["instruction"],
            check=_PRELUDES[language] + raw["check"].lstrip("\n"), solution=raw["solution"], kind=kind,
        ))
    return tuple(cases)


MULTILINE_CASES: tuple[EditCase, ...] = load_cases(MULTILINE_FILE)
CASES: tuple[EditCase, ...] = _PYTHON + _JAVASCRIPT + _BASH + MULTILINE_CASES

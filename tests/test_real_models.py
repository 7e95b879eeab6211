"""The real models against llama.cpp's reference, and speculative == plain on real prompts.

llama.cpp quantizes activations to 8 bits in its CPU matrix products, so a rare
near-tie may resolve differently: the teacher-forced agreement is asserted
(≥ 95% of positions), and the identical greedy prefix per prompt is reported.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from echoline.engine.api import Engine
from echoline.engine.drafting.controller import DraftController, VerifyCost
from echoline.engine.model_catalog import MODELS

from tests.conftest import cpu_backend_name, greedy_reference, large_models_enabled

pytestmark = pytest.mark.slow

LARGE = pytest.mark.skipif(not large_models_enabled(), reason="the 1.5B model: set ECHOLINE_TEST_LARGE=1")
#: Every named model; the 1.5B only where ECHOLINE_TEST_LARGE=1 gives it the time.
NAMES = ["smollm2", "gemma3-270m", "qwen2.5-coder-0.5b",
         pytest.param("qwen2.5-coder-1.5b", marks=[LARGE, pytest.mark.large])]
#: The issue's bar for the real code models; the two small ones were held to 95 %.
MIN_AGREEMENT = {"qwen2.5-coder-0.5b": 0.97, "qwen2.5-coder-1.5b": 0.97}
_ENGINES: dict[tuple[str, str], Engine] = {}


def engine_for(name: str, backend: str | None = None) -> Engine:
    """A cached engine; ``cpu/q8`` and ``cpu/f32`` are the cpu backend in one activation mode
    (plain ``cpu`` is whatever the machine's default is)."""
    key = (name, backend or cpu_backend_name())
    if key not in _ENGINES:
        if key[1] in ("cpu/q8", "cpu/f32"):
            from echoline.engine.backends.cpu_backend import CpuBackend
            from echoline.engine.model_catalog import resolve_model

            mode = key[1].split("/")[1]
            _ENGINES[key] = Engine(resolve_model(name), backend=CpuBackend(activations=mode))
        else:
            _ENGINES[key] = Engine.load(name, backend=key[1])
    return _ENGINES[key]


def _q8() -> bool:
    from echoline.kernels.cpu.q8act import q8_available

    return q8_available()


#: The cpu backend in both activation modes: each mode's replies are its own, and each must
#: be exact (spec == plain) and still agree with llama.cpp (which quantizes activations too).
CPU_MODES = ["cpu/f32", pytest.param("cpu/q8", marks=pytest.mark.skipif(not _q8(), reason="needs AVX2 or AVX-512 VNNI"))]


def _mlx_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("mlx") is not None


BACKENDS = [*CPU_MODES, pytest.param("mlx", marks=pytest.mark.skipif(not _mlx_available(), reason="mlx not installed"))]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", NAMES)
def test_agreement_with_llamacpp(name, backend):
    if backend == "mlx" and name.startswith("qwen"):
        # mlx[cpu] on Linux is MLX's portable CPU path, not what an Apple user runs: 7 min
        # for the 0.5B here. The MLX backend's exactness is covered on the small models.
        pytest.skip("Qwen on MLX: only meaningful on Apple silicon (mlx[cpu] took 7 min here)")
    eng = engine_for(name, backend)
    ref = greedy_reference(MODELS[name].filename)
    agree = total = 0
    prefixes = {}
    cases = list(ref.items())
    if backend == "mlx":
        # mlx[cpu] on Linux computes a row at a time at ~0.2 s a row for Gemma 3 (12-22 s a
        # case here): three cases of code, not all eight. Apple silicon is where MLX runs.
        cases = cases[:3]
    for key, case in cases:
        assert eng.tokenizer.encode(case["prompt"]) == case["prompt_ids"], key
        ids = case["prompt_ids"] + case["greedy_ids"]
        logits = eng.backend.to_host(eng.model.forward(ids, eng.model.new_cache(len(ids) + 8)))
        pred = np.argmax(logits, axis=-1)[len(case["prompt_ids"]) - 1 : -1]
        agree += int((pred == np.array(case["greedy_ids"])).sum())
        total += len(case["greedy_ids"])
        if backend == "mlx":
            # The greedy prefix is a report, not a check; on mlx[cpu] it took 5 of this
            # test's 7 minutes here. MLX's greedy replies are checked against llama.cpp's in
            # tests/test_mlx_backend.py; the teacher-forced rate is checked below.
            continue
        greedy = eng.generate(case["prompt_ids"], max_tokens=len(case["greedy_ids"]), spec=False)
        same = 0
        for a, b in zip(greedy.token_ids, case["greedy_ids"], strict=False):
            if a != b:
                break
            same += 1
        prefixes[key] = same
    rate = agree / total
    report = {"model": name, "backend": eng.backend_variant, "teacher_forced_agreement": round(rate, 4),
              "identical_greedy_prefix": prefixes}
    sys.stderr.write(json.dumps(report) + "\n")
    out = Path(__file__).parent / "reports"
    out.mkdir(exist_ok=True)
    (out / f"llamacpp-agreement-{name}-{eng.backend_variant.replace('/', '-')}.json").write_text(json.dumps(report, indent=1))
    assert rate >= MIN_AGREEMENT.get(name, 0.95), report


CODE = Path(__file__).resolve().parent.parent / "engine" / "sessions.py"


def varied_prompts(eng: Engine) -> list[tuple[list[int], tuple[str, ...]]]:
    src = CODE.read_text()
    snippets = [src[i : i + 700] for i in range(0, 2800, 700)]
    questions = [
        "What is a closure in Python?",
        "Write a haiku about compilers.",
        "List three sorting algorithms.",
        "How do I reverse a string in Python?",
        "Explain recursion to a child.",
        "Say hello.",
        "What does HTTP stand for?",
        "Name a prime number larger than 10.",
        "Translate 'good morning' into French.",
    ]
    prompts: list[tuple[list[int], tuple[str, ...]]] = []
    for s in snippets:
        text = f"```python\n{s}\n```\nRewrite the code above EXACTLY, character for character."
        ids = eng.encode_chat([{"role": "user", "content": text}]) if eng.has_chat_template else eng.encode(text + "\n```python\n")
        prompts.append((ids, ()))
        prompts.append((eng.encode(s), ()))  # raw continuation of code
    for q in questions:
        ids = eng.encode_chat([{"role": "user", "content": q}]) if eng.has_chat_template else eng.encode(f"Q: {q}\nA:")
        prompts.append((ids, ()))
    # Stop strings that land inside accepted runs, and a repetitive prompt with long matches.
    prompts.append((eng.encode(snippets[0]), ("\n\n",)))
    prompts.append((eng.encode(snippets[1]), ("self",)))
    prompts.append((eng.encode("a b c d e f g a b c d e f g a b c d e f g a b c"), ()))
    prompts.append((eng.encode("for i in range(10):\n    print(i)\n" * 6), ("range(7",)))
    return prompts


def check_spec_equals_plain(eng: Engine) -> int:
    """Speculative == plain (token ids, finish reason) on every varied prompt; drafts accepted."""
    prompts = varied_prompts(eng)
    assert len(prompts) >= 20
    accepted = 0
    for i, (ids, stop) in enumerate(prompts):
        max_tokens = 24 + (i % 3) * 7  # budgets that end mid-round
        plain = eng.generate(ids, max_tokens=max_tokens, stop=stop, spec=False)
        spec = eng.generate(ids, max_tokens=max_tokens, stop=stop, spec=True)
        assert spec.token_ids == plain.token_ids, (i, plain.text, spec.text)
        assert spec.finish_reason == plain.finish_reason
        accepted += spec.stats.accepted
    return accepted


@pytest.mark.parametrize("mode", CPU_MODES)
@pytest.mark.parametrize("name", NAMES)
def test_speculative_equals_plain_on_real_prompts(name, mode):
    eng = engine_for(name, mode)
    # Exactness, not policy, is under test: a near-flat cost curve makes the controller
    # verify every draft it gets, so every acceptance path runs whatever this machine's
    # measured costs are. (The measured controller is exercised by the other tests.)
    eng._controller = DraftController(VerifyCost.from_ratios([1.0 + 0.01 * r for r in range(18)]), max_draft=16)
    accepted = check_spec_equals_plain(eng)
    eng._controller = None  # back to the measured controller for the other tests
    assert accepted > 0  # speculation actually ran on these prompts


@pytest.mark.parametrize("mode", CPU_MODES)
@pytest.mark.parametrize("name", NAMES)
def test_multi_turn_on_a_reused_cache(name, mode):
    """Second and third turns on the same session: spec == plain == cold, token ids."""
    eng = engine_for(name, mode)
    turns = ["Write a Python function that adds two numbers.", "Now make it add three.", "Thanks!"]
    replies = {}
    for kind in ("plain", "spec", "cold"):
        messages: list[dict[str, str]] = []
        history: list[int] = []
        out = []
        for q in turns:
            if eng.has_chat_template:
                messages.append({"role": "user", "content": q})
                ids = eng.encode_chat(messages)
            else:
                ids = history + eng.encode(f"\nQ: {q}\nA:")[(1 if history else 0):]
            res = eng.generate(ids, max_tokens=20, spec=kind == "spec",
                               session=None if kind == "cold" else f"turns-{kind}-{name}")
            if kind != "cold" and len(out) > 0:
                assert res.stats.reused_tokens > 0
            out.append(res.token_ids)
            messages.append({"role": "assistant", "content": res.text})
            history = ids + res.token_ids
        replies[kind] = out
    assert replies["plain"] == replies["spec"] == replies["cold"]

"""A model per job (issue 49): the machine's choice, the settings' precedence, and the
worker's engines by job (shared when both jobs name one model, loaded on first use)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from echoline.engine import model_choice as mc
from echoline.engine.model_choice import BEST, FASTEST, Speeds, choose_rewrite_model
from echoline.sidecar import config as cfg
from echoline.sidecar.engine_choice import job_models
from echoline.sidecar.worker import EngineWorker

# Speeds as measured on the CPUs in docs/benchmarks.md (one decode step, a 160-token tail).
ZEN5_BEST = Speeds(decode_s=0.030, tail_s=0.80)  # 1.5B: ~31 tok/s, ~200 tok/s prefill
SLOW_BEST = Speeds(decode_s=0.075, tail_s=2.2)  # 1.5B on an old 2-core laptop
ZEN5_FAST = Speeds(decode_s=0.0154, tail_s=0.30)  # 0.5B
ZEN4_2CORE_BEST = Speeds(decode_s=0.055, tail_s=1.52)  # 1.5B, 2-core Zen 4: 2.35 s a warm rewrite
AVX512 = frozenset({"avx2", "avx512f", "avx512vnni"})
AVX2 = frozenset({"avx2", "fma"})


@pytest.mark.parametrize(("backend", "speeds", "cores", "features", "model", "why"), [
    ("cuda", None, 2, None, BEST, "GPU"),
    ("mlx", None, 8, None, BEST, "Apple silicon"),
    ("numpy", {BEST: ZEN5_BEST}, 64, AVX512, FASTEST, "numpy"),
    ("cpu", {BEST: ZEN5_BEST}, 2, None, BEST, "measured"),
    ("cpu", {BEST: ZEN4_2CORE_BEST}, 2, AVX512, BEST, "measured"),  # the 2-core Zen 4 of docs/models.md
    ("cpu", {BEST: SLOW_BEST}, 2, AVX512, FASTEST, "too slow"),  # a measurement beats the features
    ("cpu", {FASTEST: ZEN5_FAST}, 2, None, BEST, "estimated from the 0.5B"),
    ("cpu", {FASTEST: Speeds(0.045, 1.0)}, 2, None, FASTEST, "too slow"),
    ("cpu", {BEST: SLOW_BEST, FASTEST: ZEN5_FAST}, 16, None, FASTEST, "measured"),  # its own speed wins
    ("cpu", None, 2, AVX512, BEST, "avx512vnni (not measured"),  # a fresh 2-core Zen 4 / Sapphire Rapids
    ("cpu", None, 2, AVX2 | {"avxvnni"}, BEST, "avxvnni (not measured"),  # Alder Lake class
    ("cpu", None, 2, AVX2, FASTEST, "not measured"),  # a fresh 2-core Zen 2 keeps the 0.5B
    ("cpu", None, 2, None, FASTEST, "not measured"),  # features unknown: cores alone
    ("cpu", {}, 16, AVX2, BEST, "not measured"),
    ("cpu", {}, 1, AVX512, FASTEST, "not measured"),
])  # fmt: skip
def test_rewrite_model_follows_the_machine(backend: str, speeds: dict | None, cores: int,
                                           features: frozenset[str] | None, model: str, why: str) -> None:  # fmt: skip
    choice = choose_rewrite_model(backend, speeds, cores, features)
    assert choice.model == model and why in choice.reason, choice
    if speeds and backend == "cpu":  # the estimate behind a measured choice is reported
        assert choice.estimate_s is not None and (choice.estimate_s <= mc.TARGET_S) == (model == BEST)


def test_the_estimate_is_the_warm_rewrite_of_ten_lines() -> None:
    """Prefill of the tail, then the reply at plain speed times the speculation's gain."""
    est = mc.rewrite_seconds(Speeds(decode_s=0.04, tail_s=1.0))
    assert est == pytest.approx(1.0 * 120 / 160 + mc.REPLY_TOKENS * 0.04 / mc.SPEC_GAIN)
    # the 2-core Zen 4 of docs/models.md: measured 2.32-2.35 s, estimated within 5 %
    assert mc.rewrite_seconds(ZEN4_2CORE_BEST) == pytest.approx(2.33, rel=0.05)
    assert mc.choose_inline_model().model == FASTEST


def test_speeds_recorded_by_one_process_steer_the_next(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ECHOLINE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr("echoline.engine.backends.resolve_backend_name", lambda name: "cpu")
    assert mc.read_speeds("cpu") == {}
    monkeypatch.setattr(mc, "_cpu_features", lambda: AVX2)
    assert mc.machine_choice()["rewrite"].model == (BEST if (mc.os.cpu_count() or 0) >= 8 else FASTEST)
    mc.record_speeds("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "cpu", SLOW_BEST)  # by file name
    assert mc.read_speeds("cpu") == {BEST: SLOW_BEST} and mc.read_speeds("cuda") == {}
    assert mc.machine_choice()["rewrite"].model == FASTEST
    mc.record_speeds("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "cpu", ZEN5_BEST)  # faster: kept
    picked = mc.machine_choice()
    assert picked["rewrite"].model == BEST and picked["inline"].model == FASTEST
    mc.record_speeds("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "cpu", Speeds(0.5, 0.5))  # under load
    assert mc.read_speeds("cpu") == {BEST: Speeds(ZEN5_BEST.decode_s, 0.5)}  # the fastest of each
    (tmp_path / "calibration" / mc.SPEEDS_FILE).write_text("{not json")
    assert mc.read_speeds("cpu") == {}


def _machine(rewrite: str) -> object:
    def machine(backend: str) -> dict[str, mc.Choice]:
        return {"rewrite": mc.Choice(rewrite, "test machine"), "inline": mc.choose_inline_model()}

    return machine


def test_settings_precedence_model_then_the_jobs_own() -> None:
    """``model`` sets both jobs; ``rewriteModel``/``inlineModel`` win over it; "auto"
    (the default) leaves each job to the machine; null follows ``model`` again."""
    base = cfg.Settings()
    assert base.model == cfg.AUTO and base.rewrite_model is None and base.inline_model is None
    got = job_models(base, _machine(BEST))
    assert (got["rewrite"].model, got["inline"].model) == (BEST, FASTEST)
    assert got["rewrite"].reason == "test machine" and got["rewrite"].key != got["inline"].key

    both, errs = cfg.apply(base, {"model": "smollm2"})
    got = job_models(both, _machine(BEST))
    assert errs == [] and got["rewrite"].model == got["inline"].model == "smollm2"
    assert got["rewrite"].key == got["inline"].key and got["inline"].reason == "model setting"

    own, errs = cfg.apply(both, {"rewriteModel": "qwen2.5-coder-1.5b", "inlineModel": "gemma3-270m"})
    got = job_models(own, _machine(FASTEST))
    assert errs == [] and (got["rewrite"].model, got["inline"].model) == ("qwen2.5-coder-1.5b", "gemma3-270m")
    assert got["rewrite"].reason == "rewriteModel setting" and got["inline"].reason == "inlineModel setting"
    assert cfg.as_lsp_dict(own)["rewriteModel"] == "qwen2.5-coder-1.5b"
    assert own.engine_key() != both.engine_key()  # a job's model change reloads

    auto_rewrite, _ = cfg.apply(own, {"rewriteModel": "auto", "inlineModel": None})
    got = job_models(auto_rewrite, _machine(BEST))
    assert (got["rewrite"].model, got["inline"].model) == (BEST, "smollm2")

    kept, errs = cfg.apply(own, {"rewriteModel": 3})
    assert kept.rewrite_model == "qwen2.5-coder-1.5b" and len(errs) == 1 and "rewriteModel" in errs[0]


def test_the_machine_is_asked_only_for_auto() -> None:
    asked: list[str] = []

    def machine(backend: str) -> dict[str, mc.Choice]:
        asked.append(backend)
        return _machine(BEST)(backend)  # type: ignore[operator]

    s, _ = cfg.apply(cfg.Settings(), {"model": "smollm2", "backend": "numpy"})
    job_models(s, machine)
    assert asked == []
    s, _ = cfg.apply(s, {"rewriteModel": "auto"})
    job_models(s, machine)
    assert asked == ["numpy"]


class _Stand:
    """A stand-in engine (no EngineLike): its name and the sources it was given."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.sources: dict[str, str] = {}

    def set_source(self, sid: str, text: str) -> None:
        self.sources[sid] = text

    def remove_source(self, sid: str) -> None:
        self.sources.pop(sid, None)


def test_worker_holds_an_engine_per_job_shared_when_the_model_is_the_same() -> None:
    loads: list[str] = []

    def loader(model: str, **kw: object) -> _Stand:
        loads.append(model)
        return _Stand(model)

    w = EngineWorker(loader)
    try:
        w.set_source("file:///a.py", "a = 1\n")
        w.load("big", jobs=("rewrite",), key="big").future.result(5)
        assert w.state_of("rewrite") == "ready" and w.state_of("inline") == "idle"
        assert w.engine_for("inline") is None and w.engine is w.engine_for("rewrite")
        seen = w.submit(lambda e, _c: e, kind="inline").future.result(5)
        assert seen is None  # no inline engine yet: the job gets none
        w.load("small", jobs=("inline",), key="small").future.result(5)
        on = {k: w.submit(lambda e, _c: e.model, kind=k).future.result(5)
              for k in ("rewrite", "prefill", "inline", "warm", "status")}
        assert on == {"rewrite": "big", "prefill": "big", "inline": "small", "warm": "small", "status": "big"}
        w.set_source("file:///b.py", "b = 2\n")
        w.sync_sources().future.result(5)
        for job in ("rewrite", "inline"):  # both engines draft from the same workspace sources
            assert w.engine_for(job).sources == {"file:///a.py": "a = 1\n", "file:///b.py": "b = 2\n"}
        # The inline job moves to the rewrite's model: shared, not loaded again; "small" goes.
        w.load("big", jobs=("inline",), key="big").future.result(5)
        assert loads == ["big", "small"] and w.engine_for("inline") is w.engine_for("rewrite")
        assert [e["jobs"] for e in w.engines()] == [["inline", "rewrite"]]
        w.release(("inline",)).future.result(5)
        assert w.state_of("inline") == "idle" and w.state_of("rewrite") == "ready"
    finally:
        w.stop()


def test_a_failed_inline_load_leaves_the_rewrite_engine_alone() -> None:
    def loader(model: str, **kw: object) -> _Stand:
        if model == "missing":
            raise FileNotFoundError(model)
        return _Stand(model)

    w = EngineWorker(loader)
    try:
        w.load("big", jobs=("rewrite",), key="big").future.result(5)
        with pytest.raises(FileNotFoundError):
            w.load("missing", jobs=("inline",), key="missing").future.result(5)
        assert w.state_of("inline") == "error" and "missing" in (w.error_of("inline") or "")
        assert w.state == "ready" and w.error is None
        gate = threading.Event()
        w.submit(lambda e, _c: gate.set(), kind="rewrite").future.result(5)
        assert gate.is_set()
    finally:
        w.stop()


def test_doctor_says_which_model_does_what(smollm2_path: Path, gemma_path: Path) -> None:
    """``echoline doctor`` reports each job's model and why (``jobs``, ``modelSummary``, a
    ``models`` check), checks each job's file, and keeps ``model`` the rewrite job's."""
    import json
    import subprocess
    import sys

    from echoline.engine.setup_check import setup_report

    report = setup_report("smollm2", "auto", inline_model="gemma3-270m")
    assert report["model"]["path"] == str(smollm2_path)
    assert {j: (m["model"], m["reason"]) for j, m in report["jobs"].items()} == {
        "rewrite": ("smollm2", "--model"), "inline": ("gemma3-270m", "--inline-model")}
    assert report["jobs"]["inline"]["file"]["path"] == str(gemma_path)
    names = {c["name"]: c for c in report["checks"]}
    assert names["inline model"]["ok"] and "inline: gemma3-270m" in names["models"]["detail"]
    assert report["modelSummary"] == "rewrite: smollm2 (--model) · inline: gemma3-270m (--inline-model)"

    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-m", "echoline", "doctor", "--rewrite-model", "gemma3-270m",
                           "--inline-model", "auto", "--json"], cwd=root, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == 0 and out["jobs"]["rewrite"]["model"] == "gemma3-270m"
    assert out["jobs"]["inline"] == {**out["jobs"]["inline"], "model": FASTEST, "reason": "fastest"}
    assert "models: rewrite: gemma3-270m (--rewrite-model)" in proc.stderr


def test_echoline_rewrite_takes_the_machines_rewrite_model(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """`echoline rewrite` without --model runs the rewrite job's model, said on stderr
    with its reason; a named model is taken as given."""
    from echoline.sidecar import rewrite_cli

    monkeypatch.setattr(mc, "machine_choice", _machine(BEST))
    assert rewrite_cli.build_parser().parse_args(["f.py", "--range", "1:1"]).model == "auto"
    assert rewrite_cli.resolve_model("auto", "cpu") == BEST
    assert f"rewrite model {BEST} (test machine)" in capsys.readouterr().err
    assert rewrite_cli.resolve_model(FASTEST, "cpu") == FASTEST and capsys.readouterr().err == ""

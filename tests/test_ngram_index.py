"""N-gram draft index: exact longest-suffix matches, preferences, incremental updates, memory cap."""

from __future__ import annotations

import random
import time

from echoline.engine.drafting import Draft, NgramIndex
from echoline.engine.drafting.ngram_index import brute_force_draft, brute_force_match
from hypothesis import given, settings
from hypothesis import strategies as st

SIDS = ["file:/a.py", "prompt", "reply", "file:/b.py"]


def _check(idx: NgramIndex, srcs: dict[str, list[int]], ctx: list[int], max_len: int = 5) -> None:
    order = idx.sources()
    assert sorted(order) == sorted(srcs)
    ref_len, ref_sid, ref_end = brute_force_match([(s, srcs[s]) for s in order], ctx, idx.max_n)
    d = idx.draft(ctx, max_len)
    if ref_len == 0:
        assert d.tokens == [] and d.match_len == 0
        return
    assert (d.match_len, d.source, d.position) == (ref_len, ref_sid, ref_end)
    assert d.tokens == brute_force_draft([(s, srcs[s]) for s in order], ctx, idx.max_n, max_len)


streams = st.lists(st.integers(0, 3), max_size=300)


@settings(max_examples=150, deadline=None)
@given(
    data=st.data(),
    max_n=st.sampled_from([1, 2, 5, 8, 32]),
    built=st.lists(st.tuples(st.sampled_from(SIDS), streams, st.booleans()), max_size=6),
)
def test_matches_brute_force(data, max_n: int, built) -> None:
    idx = NgramIndex(max_n=max_n)
    srcs: dict[str, list[int]] = {}
    for sid, toks, incremental in built:
        if incremental and toks:
            cut = data.draw(st.integers(1, len(toks)))
            idx.extend_source(sid, toks[:cut])
            idx.extend_source(sid, toks[cut:])
            srcs[sid] = srcs.get(sid, []) + toks
        else:
            idx.set_source(sid, toks)
            srcs[sid] = list(toks)
        # Look up between updates too: a lookup caches the search order, and a later
        # replacement must not leave the old source object in it.
        _check(idx, srcs, data.draw(st.lists(st.integers(0, 3), min_size=1, max_size=40)))
    for _ in range(8):
        ctx = data.draw(st.lists(st.integers(0, 3), min_size=1, max_size=40))
        _check(idx, srcs, ctx)
    if srcs.get("reply"):  # the context as the tail of the reply: no self-match
        _check(idx, srcs, srcs["reply"][-40:])


def test_random_streams_many_chunks() -> None:
    """Long streams grown token by token cross many tail flushes and run merges."""
    rng = random.Random(7)
    for vocab in (2, 5, 40):
        idx = NgramIndex(max_n=16)
        srcs = {"prompt": [rng.randrange(vocab) for _ in range(1500)], "reply": []}
        idx.set_source("prompt", srcs["prompt"])
        for _ in range(1200):
            x = rng.randrange(vocab)
            srcs["reply"].append(x)
            idx.extend_source("reply", [x])
            if rng.random() < 0.1:
                _check(idx, srcs, (srcs["prompt"] + srcs["reply"])[-64:], 8)
        for _ in range(50):
            _check(idx, srcs, [rng.randrange(vocab) for _ in range(rng.randrange(1, 30))])


def test_longest_wins_over_recency() -> None:
    idx = NgramIndex()
    idx.set_source("file:/x", [1, 2, 3, 4, 50, 51])
    idx.set_source("prompt", [9, 3, 4, 60, 61])
    idx.extend_source("reply", [8, 4, 70])
    d = idx.draft([1, 2, 3, 4], 4)
    assert d == Draft([50, 51], "file:/x", 4, 4)


def test_equal_length_prefers_reply_then_prompt_then_newest_file() -> None:
    idx = NgramIndex()
    idx.set_source("file:/old", [5, 6, 10])
    idx.set_source("file:/new", [5, 6, 11])
    assert idx.draft([5, 6], 3).source == "file:/new"
    idx.set_source("file:/old", [5, 6, 12])  # updated later: now the newest file
    assert idx.draft([5, 6], 3) == Draft([12], "file:/old", 2, 2)
    idx.set_source("prompt", [5, 6, 13])
    assert idx.draft([5, 6], 3).source == "prompt"
    idx.extend_source("reply", [5, 6, 14])
    assert idx.draft([5, 6], 3).source == "reply"
    idx.set_source("file:/new", [7, 5, 6, 15])  # longer match beats preference
    assert idx.draft([7, 5, 6], 3) == Draft([15], "file:/new", 3, 3)
    assert idx.sources() == ["reply", "prompt", "file:/new", "file:/old"]


def test_latest_occurrence_within_source() -> None:
    idx = NgramIndex()
    idx.set_source("prompt", [1, 2, 100, 7, 1, 2, 200, 7, 3])
    assert idx.draft([1, 2], 2) == Draft([200, 7], "prompt", 2, 6)


def test_continuation_stops_at_source_end_and_max_len() -> None:
    idx = NgramIndex()
    idx.set_source("prompt", [1, 2, 3, 4, 5])
    assert idx.draft([2], 10).tokens == [3, 4, 5]
    assert idx.draft([2], 2).tokens == [3, 4]
    assert idx.draft([2], 0).tokens == []
    assert idx.draft([], 4).tokens == []
    assert idx.draft([99], 4) == Draft()


def test_no_self_match() -> None:
    idx = NgramIndex()
    reply = [4, 5, 6, 7]
    idx.extend_source("reply", reply)
    assert idx.draft(reply, 4).tokens == []  # the only occurrence is the context itself
    idx.set_source("prompt", [4, 5, 6, 7])
    assert idx.draft([4, 5, 6, 7], 4).tokens == []  # prompt end: nothing follows
    idx.extend_source("reply", [4, 5, 6, 7])
    d = idx.draft(reply + reply, 4)  # earlier occurrence inside the reply is fine
    assert d == Draft([4, 5, 6, 7], "reply", 4, 4)


def test_incremental_extend_equals_set_source() -> None:
    rng = random.Random(3)
    toks = [rng.randrange(6) for _ in range(2000)]
    a, b = NgramIndex(), NgramIndex()
    a.set_source("prompt", toks)
    i = 0
    while i < len(toks):
        j = i + rng.choice([1, 1, 2, 7, 130, 400])
        b.extend_source("prompt", toks[i:j])
        i = j
    for _ in range(300):
        ctx = [rng.randrange(6) for _ in range(rng.randrange(1, 40))]
        assert a.draft(ctx, 6) == b.draft(ctx, 6)
    # growth merges sorted runs, so a lookup searches only a few of them
    c = NgramIndex()
    for t in toks * 5:
        c.extend_source("reply", [t])
    assert len(c._sources["reply"].runs) <= 6


def test_replaced_pinned_sources_are_searched_after_a_lookup() -> None:
    """Each request replaces "prompt" and "reply"; drafts must come from the new ones.

    Regression: the cached search order kept the first request's source objects, so every
    later request drafted from the first request's prompt and reply.
    """
    idx = NgramIndex()
    idx.set_source("prompt", [1, 2, 3, 4])
    idx.set_source("reply", [])
    assert idx.draft([1, 2], 2).tokens == [3, 4]
    idx.set_source("prompt", [1, 2, 7, 8])
    idx.set_source("reply", [])
    assert idx.draft([1, 2], 2).tokens == [7, 8]
    idx.extend_source("reply", [5, 6, 9, 5, 6])
    d = idx.draft([9, 5, 6], 2)
    assert (d.source, d.tokens) == ("reply", [9, 5])


def test_remove_and_replace() -> None:
    idx = NgramIndex()
    idx.set_source("file:/a", [1, 2, 3])
    assert idx.has_source("file:/a") and idx.draft([1, 2], 1).tokens == [3]
    idx.set_source("file:/a", [1, 2, 9])
    assert idx.draft([1, 2], 1).tokens == [9]
    assert idx.remove_source("file:/a") is True
    assert idx.remove_source("file:/a") is False
    assert not idx.has_source("file:/a") and idx.draft([1, 2], 1).tokens == []
    assert idx.sources() == [] and idx.memory_bytes() == 0


def test_memory_cap_evicts_least_recently_updated_extra_sources() -> None:
    idx = NgramIndex(max_bytes=10**9)
    rng = random.Random(0)
    big = [rng.randrange(1000) for _ in range(20_000)]
    idx.set_source("prompt", big)
    idx.extend_source("reply", big[:3000])
    one = idx.memory_bytes()
    for name in ("file:/1", "file:/2", "file:/3"):
        idx.set_source(name, big)
    per_file = (idx.memory_bytes() - one) / 3
    assert 4 * 20_000 < per_file < 20 * 20_000  # about 8-14 bytes per token
    idx.set_source("file:/1", big[:100])  # touch: file:/2 is now the oldest
    idx.max_bytes = idx.memory_bytes() - 1
    idx.extend_source("reply", [1])
    assert idx.evicted == ["file:/2"]
    assert idx.memory_bytes() <= idx.max_bytes
    idx.max_bytes = 1  # prompt and reply are never evicted
    idx.set_source("file:/4", big)
    assert set(idx.sources()) == {"reply", "prompt"}
    assert idx.evicted[-1] == "file:/4"
    assert idx.memory_bytes() == sum(_approx(idx, s) for s in idx.sources())


def _approx(idx: NgramIndex, sid: str) -> int:
    return idx._sources[sid].nbytes


def test_lookup_speed_benchmark() -> None:
    """Prints lookup latency on code-like streams (not a timed assertion)."""
    rng = random.Random(1)
    words = [rng.randrange(3000) for _ in range(400)]

    def code(n: int) -> list[int]:
        out: list[int] = []
        while len(out) < n:
            line = rng.randrange(len(words) - 12)
            out += words[line : line + rng.randrange(3, 12)] + [0]
        return out[:n]

    idx = NgramIndex()
    for i in range(4):
        idx.set_source(f"file:/{i}", code(50_000))
    prompt = code(3000)
    idx.set_source("prompt", prompt)
    target = prompt[500:2500]
    lat = []
    for i, x in enumerate(target):
        ctx = (prompt + target[:i])[-64:]
        t0 = time.perf_counter()
        d = idx.draft(ctx, 16)
        lat.append(time.perf_counter() - t0)
        idx.extend_source("reply", [x])
        assert d.match_len >= 1
    lat.sort()
    print(
        f"\ndraft lookup: median {lat[len(lat) // 2] * 1e6:.1f} us, "
        f"p99 {lat[int(0.99 * len(lat))] * 1e6:.1f} us over 203k indexed tokens; "
        f"memory {idx.memory_bytes() / 1e6:.2f} MB"
    )


@settings(max_examples=60, deadline=None)
@given(data=st.data(), nfiles=st.integers(1, 12), alphabet=st.sampled_from([4, 50, 3000]))
def test_many_files_with_the_gram_filter_match_brute_force(data, nfiles: int, alphabet: int) -> None:
    """Extra sources are skipped by their n-gram filter only when they cannot hold a longer
    match: lookups over many files (built at once or extended piecewise, then replaced)
    still equal the brute-force search."""
    tok = st.integers(0, alphabet - 1)
    idx = NgramIndex(max_n=8)
    srcs: dict[str, list[int]] = {}
    base = data.draw(st.lists(tok, min_size=1, max_size=60))
    idx.set_source("prompt", base)
    srcs["prompt"] = base
    for i in range(nfiles):
        toks = data.draw(st.lists(tok, max_size=120))
        if data.draw(st.booleans()) and len(toks) > 1:
            cut = data.draw(st.integers(1, len(toks) - 1))
            idx.extend_source(f"file:{i}", toks[:cut])
            idx.extend_source(f"file:{i}", toks[cut:])
        else:
            idx.set_source(f"file:{i}", toks)
        srcs[f"file:{i}"] = list(toks)
    if nfiles > 1:  # a replaced file must be filtered by its new tokens only
        new = data.draw(st.lists(tok, max_size=80))
        idx.set_source("file:0", new)
        srcs["file:0"] = list(new)
    for _ in range(10):
        pick = data.draw(st.sampled_from(sorted(srcs)))
        stream = srcs[pick]
        if len(stream) > 2 and data.draw(st.booleans()):  # a tail that does occur somewhere
            end = data.draw(st.integers(1, len(stream)))
            ctx = stream[max(0, end - data.draw(st.integers(1, 12))) : end]
        else:
            ctx = data.draw(st.lists(tok, min_size=1, max_size=12))
        _check(idx, srcs, ctx)


def test_gram_filter_skips_files_that_cannot_match(monkeypatch) -> None:
    """With many workspace files, a lookup whose last four tokens occur in one file asks only
    that file (and the pinned sources) for a match, not all of them."""
    from echoline.engine.drafting import ngram_index

    rng = random.Random(3)
    idx = NgramIndex()
    target = [rng.randrange(100_000) for _ in range(40)]
    # The needle is the oldest file, so the search order reaches it last.
    idx.set_source("file:/needle", [rng.randrange(100_000) for _ in range(500)] + target + [7, 8, 9])
    for i in range(60):
        idx.set_source(f"file:/{i}", [rng.randrange(100_000) for _ in range(2_000)])
    assert idx.sources()[-1] == "file:/needle"
    idx.set_source("prompt", target[:30])
    calls: list[str] = []
    real = ngram_index._Source.best

    def counting(self, q, min_len):
        calls.append(self.sid)
        return real(self, q, min_len)

    monkeypatch.setattr(ngram_index._Source, "best", counting)
    d = idx.draft(target, 3)  # only the needle holds the context's tail (32 tokens, max_n)
    assert d.source == "file:/needle" and d.match_len == 32 and d.tokens == [7, 8, 9]
    assert "file:/needle" in calls and len(calls) <= 8, calls  # of 62 sources


def test_a_repeating_reply_is_drafted_past_its_end() -> None:
    """A reply caught in a loop of period P drafts the loop up to max_len, not P tokens;
    other sources (and a reply that is not the context's tail) stop at their end."""
    loop = [5, 6, 7]
    reply = [1, 2] + loop * 4
    idx = NgramIndex(max_n=8)
    idx.set_source("prompt", [9, 9, 9])
    idx.set_source("reply", reply)
    d = idx.draft([9, 9, 9] + reply, 10)
    assert d.source == "reply" and d.match_len == 8
    assert d.tokens == (loop * 4)[:10]  # after ...5,6,7 comes 5,6,7,5,...
    # The same text as a workspace file: its end is not where the writing is.
    other = NgramIndex(max_n=8)
    other.set_source("file:/loop.py", reply)
    assert other.draft(reply, 10).tokens == loop
    # A reply that does not end with the context's tail is not the text being written.
    idx.set_source("reply", reply + [4])
    assert idx.draft(reply, 10).tokens == [4]


def test_a_prompt_that_repeats_a_block_drafts_into_the_reply_and_past_it() -> None:
    """A prompt whose last block repeats an earlier one matches near its own end; the
    continuation is then the reply written after it, and past the reply's end the loop again
    (the prompt followed by the reply is the text being written)."""
    block = [5, 6, 7, 8]
    prompt = [1] + block * 3
    idx = NgramIndex(max_n=6)
    idx.set_source("prompt", prompt)
    idx.set_source("reply", [])
    d = idx.draft(prompt, 10)  # nothing written yet: the loop from the prompt's end
    assert d.source == "prompt" and d.match_len == 6
    assert d.tokens == (block * 3)[:10]
    idx.set_source("reply", [5, 6])
    d = idx.draft(prompt + [5, 6], 10)
    assert d.source == "prompt" and d.tokens == [7, 8] + (block * 3)[:8]
    # a reply that broke the loop: the prompt's continuation, then the reply as written
    idx.set_source("reply", [9])
    assert idx.draft(prompt[:-1], 10).tokens == [8, 9]
    # without a reply source (another caller's index) the prompt stops at its end
    other = NgramIndex(max_n=6)
    other.set_source("prompt", prompt)
    assert other.draft(prompt, 10).tokens == block

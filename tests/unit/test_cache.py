"""The sweep cache (cache.py): the key sees every fact, entries round-trip atomically, a corrupt
or foreign file is a miss, and the replay verdict rejects drift in both directions."""

from __future__ import annotations

import json

import pytest

from worstcase_profiler.core.cache import (CacheEntry, SweepCache, cache_dir, cache_key,
                                           round_capacity_up)
from worstcase_profiler.core.coverage import cover_rows
from worstcase_profiler.core.cache_trust import cache_verdict as verdict
from worstcase_profiler.core.types import Shape, StepResult, SweepResult, WarmupEstimate

FACTS = {"vllm": "0.32.0", "limits": {"max_model_len": 4096}, "device": {"name": "x"}}
STOCK = StepResult(shape=Shape(kind="stock", rows=512, context_len=0, num_reqs=256),
                   peak_bytes=120, seconds=0.1, workspace_bytes=8)


def _sweep(need_step: int = 100, other: int = 50, worst_stock: bool = False) -> SweepResult:
    worst_shape = Shape(kind="prefill", rows=512, context_len=3584)
    steps = (StepResult(shape=Shape(kind="prefill", rows=1, context_len=4095), peak_bytes=other,
                        seconds=0.1),
             StepResult(shape=worst_shape, peak_bytes=need_step - 10, workspace_bytes=10,
                        seconds=0.2))
    cov = cover_rows(lambda r: r, 1, 4, tolerance=1)
    return SweepResult(stock=STOCK, steps=steps, worst=STOCK if worst_stock else steps[1],
                       worst_op="layers.0.attn", peak_bytes=need_step, coverage=cov,
                       context_curve=steps[1:], rows_max=512, post_profile_bytes=3, seconds=3.0)


def _entry(sweep: SweepResult, key: str = "k") -> CacheEntry:
    return CacheEntry(key=key, facts=FACTS, created_at="t", sweep=sweep, workspace_slot_bytes=64,
                      baseline_bytes=1000, consumed_bytes=1200,
                      warmup=WarmupEstimate(graphs_bytes=5, other_bytes=6, source="cache"))


def test_key_changes_with_any_fact_and_not_with_order():
    base = cache_key(FACTS)
    assert cache_key(dict(reversed(list(FACTS.items())))) == base
    for field, value in (("vllm", "0.33.0"), ("limits", {"max_model_len": 8192}),
                         ("device", {"name": "y"})):
        assert cache_key({**FACTS, field: value}) != base
    assert len(base) == 24


def test_capacity_rounds_up_within_a_sixteenth():
    for tokens in (1, 15, 16, 17, 1000, 2_226_928, 11_305_664):
        up = round_capacity_up(tokens)
        assert tokens <= up <= tokens * 17 // 16 + 1
    # two starts a few blocks apart share one key
    assert round_capacity_up(11_305_664) == round_capacity_up(11_307_904)


def test_dir_setting_env_default_and_off(tmp_path):
    assert cache_dir(str(tmp_path), {}) == tmp_path
    assert cache_dir(None, {"WCPROF_CACHE_DIR": str(tmp_path)}) == tmp_path
    assert cache_dir(None, {"XDG_CACHE_HOME": "/c"}) == tmp_path.__class__("/c/worstcase_profiler")
    assert cache_dir("off", {"WCPROF_CACHE_DIR": str(tmp_path)}) is None
    assert cache_dir(None, {"WCPROF_CACHE_DIR": "OFF"}) is None


def test_entries_round_trip_and_bad_files_are_misses(tmp_path):
    cache = SweepCache(tmp_path / "sub")
    key = cache_key(FACTS)
    assert cache.load(key) is None
    path = cache.store(_entry(_sweep(), key))
    assert path == cache.path(key) and not list(path.parent.glob(".*.tmp"))
    loaded = cache.load(key)
    assert loaded is not None and loaded == _entry(_sweep(), key)
    path.write_text("{not json")
    assert cache.load(key) is None
    other = cache_key({**FACTS, "vllm": "x"})
    path.write_text(_entry(_sweep(), other).to_json())
    assert cache.load(key) is None  # a file under the wrong name is not trusted
    assert json.loads(path.read_text())["key"] == other
    older = json.loads(_entry(_sweep(), key).to_json())
    older["schema"] = 1
    path.write_text(json.dumps(older))
    assert cache.load(key) is None  # another layout is a miss, not a half-read entry


def test_cached_need_is_the_worst_shapes_need():
    assert _entry(_sweep(need_step=100, other=500)).worst_need == 100


def test_a_stock_worst_shape_is_checked_against_the_stored_stock_step():
    """When nothing the sweep ran needed more than the stock step, the worst step is the stock
    step: its need (transient + workspace) is what the replay is checked against."""
    assert _entry(_sweep(worst_stock=True)).worst_need == 128


@pytest.mark.parametrize("measured, ok", [(100, True), (101, True), (102, True), (103, False),
                                          (90, True), (89, False)])
def test_verdict_rejects_growth_beyond_tolerance_and_large_drops(measured, ok):
    assert verdict(100, measured, tolerance=2) == (ok, 2)


def test_verdict_allows_two_percent_up_and_ten_percent_down_of_large_needs():
    assert verdict(1000, 1019, tolerance=1) == (True, 20)
    assert verdict(1000, 1021, tolerance=1)[0] is False
    assert verdict(1000, 901, tolerance=1)[0] is True
    assert verdict(1000, 899, tolerance=1)[0] is False


def test_with_a_secret_only_signed_entries_are_trusted(tmp_path):
    signer, reader = SweepCache(tmp_path, secret="s3cret"), SweepCache(tmp_path, secret="s3cret")
    key = cache_key(FACTS)
    signer.store(_entry(_sweep(), key))
    assert reader.load(key) is not None
    data = json.loads(signer.path(key).read_text())
    data["sweep"]["peak_bytes"] //= 4  # tampered after signing
    signer.path(key).write_text(json.dumps(data))
    assert reader.load(key) is None
    SweepCache(tmp_path).store(_entry(_sweep(), key))  # written by a host without the secret
    assert reader.load(key) is None
    assert SweepCache(tmp_path, secret="other").load(key) is None


def test_a_signed_entry_verifies_as_written_when_a_later_version_adds_a_field(tmp_path):
    """The MAC covers the document the producer wrote: a reader whose entry type gained a field
    with a default (SweepResult.confirmed did, after h200-run27's signed export) still verifies
    it, and a change to any written field (the added one included) still breaks it."""
    cache = SweepCache(tmp_path, secret="s3cret")
    key = cache_key(FACTS)
    cache.store(_entry(_sweep(), key))
    data = json.loads(cache.path(key).read_text())
    assert "confirmed" in data["sweep"]
    del data["sweep"]["confirmed"]  # what an older writer left out (its MAC is made without it)
    from worstcase_profiler.core.cache import _mac
    data["mac"] = _mac(data, "s3cret")
    cache.path(key).write_text(json.dumps(data))
    assert cache.load(key) is not None
    data["sweep"]["confirmed"] = 0  # added after signing, though the field exists now
    cache.path(key).write_text(json.dumps(data))
    assert cache.load(key) is None


def test_a_cut_down_entry_written_before_confirmed_existed_is_not_used(tmp_path):
    """Without SweepResult.confirmed, a cut-down sweep's confirmations would count as cut steps
    (raised by depth_delta), which undercounts a replay's drift: such an entry is swept again."""
    import dataclasses

    cache = SweepCache(tmp_path, secret="s3cret")
    key = cache_key(FACTS)
    cut = dataclasses.replace(_sweep(), depth_delta=64, confirmed=1)
    cache.store(_entry(cut, key))
    assert cache.load(key) is not None
    data = json.loads(cache.path(key).read_text())
    del data["sweep"]["confirmed"]
    from worstcase_profiler.core.cache import _mac
    data["mac"] = _mac(data, "s3cret")
    cache.path(key).write_text(json.dumps(data))
    entry, why = cache.inspect(cache.path(key))
    assert entry is None and "before it recorded its confirmed steps" in why


def test_the_committed_signed_export_still_verifies_but_is_of_an_older_schema():
    """h200-run27's signed export (secret wcprof-bench): its MAC still verifies as its producer
    wrote it (a change to the entry type must not invalidate what producers signed), but it is
    a schema-4 entry, older than this build's SCHEMA, so it is a miss,
    never reused on the strength of its signature."""
    from pathlib import Path

    from worstcase_profiler.core.cache import SCHEMA, document_trusted
    export = Path(__file__).resolve().parents[2] / "docs/results/h200-run27/production/cache-export-signed"
    files = sorted(export.glob("*.json"))
    assert files
    for f in files:
        data = json.loads(f.read_text())
        assert data["schema"] == 4 < SCHEMA
        assert document_trusted(data, "wcprof-bench") and not document_trusted(data, "other")
        entry, why = SweepCache(export, secret="wcprof-bench").inspect(f)
        assert entry is None and why == f"not a cache entry (not a cache entry of schema {SCHEMA})"


def test_a_cached_worst_step_must_still_dominate_the_plans_heaviest_shapes():
    from worstcase_profiler.core.cache_trust import still_worst
    from worstcase_profiler.core.shapes import Limits, prefill_chunk
    from worstcase_profiler.core.sweep import dominance_checks

    limits = Limits(max_model_len=4096, max_num_batched_tokens=512, max_num_seqs=8)
    small = prefill_chunk(limits, 1)  # a forged entry names a one-row step as the worst
    checks = dominance_checks(limits, small)
    assert prefill_chunk(limits, 512) in checks and any(s.kind == "decode" for s in checks)
    assert small not in checks and len(set(checks)) == len(checks)
    assert still_worst(100, [90, 101], allowed=2)
    assert not still_worst(100, [90, 103], allowed=2)


def test_the_pool_bound_does_not_depend_on_how_vllm_estimated_its_graphs():
    # a first start makes vLLM's graph estimate exact (10 GiB here) and its KV figure smaller by
    # as much; a cached start sees the sampled estimate: one configuration, one key
    from worstcase_profiler.core.cache import pool_capacity_tokens
    GiB = 1 << 30
    common = dict(explicit_bytes=None, bytes_per_token=1 << 16, max_model_len=131072)
    first = pool_capacity_tokens(stock_kv_bytes=42 * GiB, graph_estimate_bytes=12 * GiB, **common)
    cached = pool_capacity_tokens(stock_kv_bytes=52 * GiB, graph_estimate_bytes=2 * GiB, **common)
    assert first == cached >= 54 * GiB // (1 << 16)
    assert pool_capacity_tokens(stock_kv_bytes=52 * GiB, graph_estimate_bytes=0, **common) < first
    explicit = pool_capacity_tokens(stock_kv_bytes=52 * GiB, graph_estimate_bytes=2 * GiB,
                                    **{**common, "explicit_bytes": 4 * GiB})
    assert explicit == 131072  # 4 GiB hold 65,536 tokens: at least one request at max_model_len


def test_an_unwritable_cache_directory_is_a_report_warning(read_only_dir):
    """Issue 39: an unwritable WCPROF_CACHE_DIR was a line in vLLM's log only. store_entry hands
    the warning to the session (the report's warnings, so the verdict screen shows it), naming
    the directory and what to set, and the start goes on without the cache."""
    from worstcase_profiler.adapter.sweep_cache import CacheHandle, store_entry
    from worstcase_profiler.core.types import CacheUse, Workspace

    directory = read_only_dir / "wcprof-cache"
    handle = CacheHandle(SweepCache(directory), "k", FACTS)
    warned: list[str] = []
    use = store_entry(handle, CacheUse(status="stored", key="k", path=str(directory / "k.json")),
                      _sweep(), Workspace(), 1000, 1200, WarmupEstimate(), None,
                      created_at="2026-12-01T00:00:00+00:00", warn=warned.append)
    assert use.status == "off" and use.path is None
    assert len(warned) == 1 and str(directory) in warned[0]
    assert "WCPROF_CACHE_DIR" in warned[0] and "every start sweeps again" in warned[0]


def test_the_self_checks_verdict_is_stored_signed_with_the_entry(tmp_path):
    """sweep_depth=auto's verdict (kept or fell back, with the sampled differences) is part of
    the signed entry: another host under the same secret reads it back as written, and a verdict
    edited after signing (a fall-back turned into proven, say) makes the entry untrusted."""
    from worstcase_profiler.core.types import CutDownProof

    proof = CutDownProof(verdict="proven", depth="1 of 2 layers", full_worst=None,
                         cut_worst=Shape("prefill", 64, 192, 1), full_peak_bytes=None,
                         confirmed_peak_bytes=100, full_admitted_bytes=None,
                         cut_admitted_bytes=120, resolution_bytes=512 << 10, full_seconds=None,
                         cut_seconds=1.5, deltas={"decode": 0, "stock": 4096}, depth_delta=4096,
                         method="self-check", sampled=(Shape("decode", 4, 252, 4),))
    cache, other_host = SweepCache(tmp_path, secret="s3cret"), SweepCache(tmp_path, secret="s3cret")
    key = cache_key(FACTS)
    cache.store(_entry(_sweep(), key).replace(proof=proof))
    assert other_host.load(key).proof == proof
    data = json.loads(cache.path(key).read_text())
    data["proof"]["deltas"]["decode"] = 1 << 30
    cache.path(key).write_text(json.dumps(data))
    assert other_host.load(key) is None


def test_an_entry_is_written_owner_only_and_a_report_with_the_umask(tmp_path):
    """Review: folding the writers into atomic_write made cache entries 0644 (they were 0600:
    an entry names the host's model paths) and gave every new file 0644 whatever the umask."""
    import os

    from worstcase_profiler.atomic_write import write_atomically

    old = os.umask(0o077)
    try:
        write_atomically(tmp_path / "r.json", "{}")
        assert (tmp_path / "r.json").stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(old)
    os.umask(0o022)
    try:
        write_atomically(tmp_path / "p.json", "{}")
        assert (tmp_path / "p.json").stat().st_mode & 0o777 == 0o644
        write_atomically(tmp_path / "e.json", "{}", mode=0o600)
        assert (tmp_path / "e.json").stat().st_mode & 0o777 == 0o600
        (tmp_path / "p.json").chmod(0o640)  # an existing file keeps its mode
        write_atomically(tmp_path / "p.json", "[]")
        assert (tmp_path / "p.json").stat().st_mode & 0o777 == 0o640
    finally:
        os.umask(old)


def test_the_pool_bound_follows_kv_cap_not_the_hosts_free_memory_where_the_cap_binds():
    """wcprof's CPU kv_cap (512 MiB): vLLM's CPU figure is a share of free host memory, so two
    starts of one configuration on a busy host planned different pools and missed the cache."""
    from worstcase_profiler.core.cache import pool_capacity_tokens
    GiB, MiB = 1 << 30, 1 << 20
    common = dict(explicit_bytes=None, bytes_per_token=1 << 10, max_model_len=4096,
                  graph_estimate_bytes=0, kv_cap_bytes=512 * MiB)
    quiet = pool_capacity_tokens(stock_kv_bytes=9 * GiB, **common)
    busy = pool_capacity_tokens(stock_kv_bytes=6 * GiB, **common)
    assert quiet == busy == pool_capacity_tokens(stock_kv_bytes=512 * MiB, **common)
    assert pool_capacity_tokens(stock_kv_bytes=256 * MiB, **common) < quiet  # below the cap: vLLM's


def test_an_entry_of_the_previous_schema_is_neither_found_nor_reused(tmp_path):
    """An entry of the previous schema is another build's (SCHEMA 14: entries carry the pool
    their fit planned for, which SCHEMA 13's decoder refuses, so two builds sharing a directory
    must not take each other's keys), so a signed entry of it (which skips the dominance
    re-check) must not stand for this build's sweep."""
    from worstcase_profiler.core import cache as cache_mod

    assert cache_mod.SCHEMA == 14
    key = cache_key(FACTS)
    cache = SweepCache(tmp_path, secret="s3cret")
    entry = _entry(_sweep(), key)
    older = json.loads(entry.to_json())
    older["schema"] = cache_mod.SCHEMA - 1
    older["mac"] = cache_mod._mac(older, "s3cret")  # a genuine, signed entry of the last schema
    assert cache_mod.document_trusted(older, "s3cret")
    cache.path(key).write_text(json.dumps(older))
    assert cache.load(key) is None
    assert "schema" in cache.inspect(cache.path(key))[1]
    # and the key moved with the schema: the last schema's writer names the same facts otherwise
    previous = cache_mod.json.dumps({"schema": cache_mod.SCHEMA - 1, **FACTS}, sort_keys=True,
                                    separators=(",", ":"), default=str)
    assert cache_mod.hashlib.sha256(previous.encode()).hexdigest()[:24] != key


def test_a_refused_start_forgets_the_entry_it_stored(tmp_path):
    """A start refused after its sweep was cached (a capture warm-up beyond the worst case)
    removes that entry, so the next start measures again instead of reusing the refused plan."""
    from worstcase_profiler.adapter import sweep_cache
    from worstcase_profiler.core.types import CacheUse

    path = tmp_path / "entry.json"
    path.write_text("{}")
    sweep_cache.forget(CacheUse(status="stored", key="k", path=str(path)))
    assert not path.exists()
    sweep_cache.forget(CacheUse(status="stored", key="k", path=str(path)))  # already gone: fine
    sweep_cache.forget(CacheUse(status="off"))  # nothing stored: nothing to do


def test_a_cached_reading_stands_within_the_tolerance_above_and_a_normal_drop_below():
    """core/cache_trust.reading_holds: the pool fit's cached worst step, measured again, stands
    up to the meter's tolerance above its figure (more would admit below the step) and down to
    a fresh reading's normal drop (further: another build)."""
    from worstcase_profiler.core.cache_trust import normal_drop, reading_holds

    cached, tol = 1000 << 20, 2 << 20
    assert reading_holds(cached, cached, tol) and reading_holds(cached, cached + tol, tol)
    assert not reading_holds(cached, cached + tol + 1, tol)
    low = cached - normal_drop(cached, tol)
    assert reading_holds(cached, low, tol) and not reading_holds(cached, low - 1, tol)

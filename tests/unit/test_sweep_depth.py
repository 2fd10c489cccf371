"""Sweep depth (core/sweep_depth.py): whether the sweep runs cut down or on the full model, on the
evidence tables, and the proof that judges a cut-down sweep against the full one."""

from __future__ import annotations

from worstcase_profiler.core import sweep_depth as depth_rules
from worstcase_profiler.core.sweep_depth import (CUTS, cut_to_prefix, judge_cut_down,
                                                  proven_cut, sweep_depth)

MiB = 1024**2


def test_auto_self_checks_every_family_and_the_explicit_settings_are_taken_as_asked(monkeypatch):
    assert sweep_depth("full", "NewForCausalLM", eager=lambda: True)[0] == "full"
    assert sweep_depth("cut-down", "NewForCausalLM", eager=lambda: True)[0] == "cut-down"
    depth, why = sweep_depth("auto", "NewForCausalLM", eager=lambda: True)
    assert depth == "self-check" and "sample of every shape class" in why
    assert "lab-proven" not in why
    monkeypatch.setitem(depth_rules.CUT_DOWN_PROVEN, "NewForCausalLM", "run N")
    depth, why = sweep_depth("auto", "NewForCausalLM", eager=lambda: True)
    assert depth == "self-check" and "lab-proven eager for NewForCausalLM: run N" in why


def test_cut_down_keeps_the_cut_its_familys_proof_ran(monkeypatch):
    """proven_cut: the compiled proof's cut on a compiled forward, else the eager one's; the
    first layer of each kind (self-check's cut) for a family no proof covers."""
    ev = {"eager": {"A": {"runs": "r1", "cut": "prefix"}, "B": {"runs": "r2", "cut": "kinds"}},
          "compiled": {"B": {"runs": "r3", "cut": "prefix"}}}
    monkeypatch.setattr(depth_rules, "_EVIDENCE", ev)
    assert proven_cut("A") == "prefix" and proven_cut("A", compiled=True) == "prefix"
    assert proven_cut("B") == "kinds" and proven_cut("B", compiled=True) == "prefix"
    assert proven_cut("NewForCausalLM") == "kinds"
    assert {proven_cut(c) for c in ("A", "B", "C")} <= set(CUTS)


def test_only_the_unchecked_cut_down_keeps_a_prefix_and_only_where_its_proof_ran_one(monkeypatch):
    ev = {"eager": {"A": {"runs": "r1", "cut": "prefix"}, "B": {"runs": "r2", "cut": "kinds"}},
          "compiled": {"B": {"runs": "r3", "cut": "prefix"}}}
    monkeypatch.setattr(depth_rules, "_EVIDENCE", ev)
    never = lambda: (_ for _ in ()).throw(AssertionError("asked"))  # noqa: E731
    for mode in ("self-check", "prove", "full"):
        assert cut_to_prefix(mode, "A", never) is False
    assert cut_to_prefix("cut-down", "A", lambda: False) is True
    assert cut_to_prefix("cut-down", "B", lambda: False) is False
    assert cut_to_prefix("cut-down", "B", lambda: True) is True
    assert cut_to_prefix("cut-down", "NewForCausalLM", lambda: True) is False


def test_auto_self_checks_a_compiled_forward_whose_graphs_by_size_it_can_read():
    """A compiled forward of a family no compiled proof covers: auto self-checks it where the
    batch sizes vLLM compiles a graph of its own for can be read (the samples then take both
    ends of every class in each graph), and sweeps it whole where they cannot."""
    for graphs in (None, lambda: None):
        depth, why = sweep_depth("auto", "OtherForCausalLM", eager=lambda: False, graphs=graphs)
        assert depth == "full" and "could not be read" in why, why
    for ranges, n in ((((1, 8192),), 1), (((4, 4), (1, 256), (257, 8192)), 3), ((), 1)):
        depth, why = sweep_depth("auto", "OtherForCausalLM", eager=lambda: False,
                                 graphs=lambda r=ranges: r)
        assert depth == "self-check" and f"that its steps run ({n} read)" in why, why
    # its own model's evidence, at any TP and on either runner (the eager self-check's scope)
    for kw in ({"runner": "v1"}, {"tensor_parallel_size": 2}):
        depth, why = sweep_depth("auto", "OtherForCausalLM", eager=lambda: False,
                                 graphs=lambda: ((1, 8192),), **kw)
        assert depth == "self-check", (kw, why)
    # a family proven compiled, an explicit self-check: the graphs are not asked for the choice
    asked = lambda: (_ for _ in ()).throw(AssertionError("asked"))  # noqa: E731
    assert sweep_depth("self-check", "OtherForCausalLM", eager=lambda: False,
                       graphs=asked)[0] == "self-check"
    # an eager forward is not asked about graphs
    depth, why = sweep_depth("auto", "OtherForCausalLM", eager=lambda: True,
                             graphs=lambda: (_ for _ in ()).throw(AssertionError("asked")))
    assert depth == "self-check" and "graph" not in why


def test_auto_self_checks_on_cuda_only_and_self_check_where_the_meter_resolution_is_known():
    """The CPU: auto sweeps whole (the same admission on every start), self-check is asked."""
    depth, why = sweep_depth("auto", "NewForCausalLM", eager=lambda: True, device_kind="cpu")
    assert depth == "full" and "not on cpu" in why and "noise" in why
    assert sweep_depth("self-check", "NewForCausalLM", eager=lambda: True,
                       device_kind="cpu")[0] == "self-check"
    depth, why = sweep_depth("auto", "NewForCausalLM", eager=lambda: True, device_kind="rocm")
    assert depth == "full" and "not on rocm" in why and "not known" in why
    depth, why = sweep_depth("self-check", "NewForCausalLM", eager=lambda: True, device_kind="rocm")
    assert depth == "full" and "not on rocm" in why
    assert sweep_depth("cut-down", "NewForCausalLM", eager=lambda: True,
                       device_kind="rocm")[0] == "cut-down"


def test_prove_runs_both_sweeps_on_any_family_that_can_be_cut():
    depth, why = sweep_depth("prove", "NewForCausalLM", eager=lambda: True)
    assert depth == "prove" and "full, then cut-down" in why


def test_a_proof_accepts_a_tie_between_two_shapes_within_the_resolution():
    from worstcase_profiler.core.types import RowsCoverage, Shape, StepResult, SweepResult

    def sweep(*steps, peak):
        stock = StepResult(Shape("stock", 64, 0, 1), MiB, 0.0)
        worst = max(steps, key=lambda r: r.peak_bytes)
        return SweepResult(stock=stock, steps=steps, worst=worst, worst_op=None, peak_bytes=peak,
                           coverage=RowsCoverage((), 64, 0, 0, 0, (), "", ""), context_curve=(), rows_max=64,
                           post_profile_bytes=0, seconds=1.0)

    a, b = Shape("prefill", 64, 100, 512), Shape("prefill", 64, 100, 256)
    full = sweep(StepResult(a, 100 * MiB, 0.0), StepResult(b, 100 * MiB - 9000, 0.0),
                 peak=102 * MiB)
    cut = sweep(StepResult(b, 100 * MiB - 9000, 0.0), peak=102 * MiB)
    assert judge_cut_down(full, cut, depth="1 of 2", resolution=MiB).proven
    far = sweep(StepResult(b, 90 * MiB, 0.0), peak=92 * MiB)
    proof = judge_cut_down(full, far, depth="1 of 2", resolution=MiB)
    assert not proof.proven and "confirmed peak" in proof.verdict and "admits" in proof.verdict


def test_cut_down_on_a_compiled_forward_says_whether_a_proof_covered_it(monkeypatch):
    """sweep_depth=cut-down keeps its message; where the graphs vLLM compiles by size cannot be
    read (no `graphs` here), auto self-checks a compiled forward only for a family the lab
    proved compiled (V2 runner, TP=1), its full-model steps read eagerly too
    (core/sweep._cut_down), else sweeps it whole; self-check is taken as asked. The proof named
    is the one for the forward, with its scope where the start is outside it."""
    monkeypatch.setitem(depth_rules.CUT_DOWN_PROVEN, "NewForCausalLM", "run N")
    for setting in ("cut-down", "prove", "self-check"):
        assert sweep_depth(setting, "NewForCausalLM", eager=lambda: False)[0] == setting
    # auto keeps the full sweep for a compiled family no compiled proof covers while its graphs
    # by size are unknown (what compiling adds is read on measured members only); self-check
    # is taken as asked
    for kw in ({}, {"runner": "v1"}, {"tensor_parallel_size": 2}):
        depth, why = sweep_depth("auto", "OtherForCausalLM", eager=lambda: False, **kw)
        assert depth == "full" and "runs compiled" in why
    assert sweep_depth("auto", "NewForCausalLM", eager=lambda: False)[0] == "full"
    assert "eager only: run N)" in sweep_depth("self-check", "NewForCausalLM",
                                               eager=lambda: False)[1]
    assert sweep_depth("auto", "NewForCausalLM", eager=lambda: True)[0] == "self-check"
    assert "TP=1" in sweep_depth("auto", "NewForCausalLM", eager=lambda: True,
                                 tensor_parallel_size=2)[1]
    monkeypatch.setitem(depth_rules.CUT_DOWN_PROVEN_COMPILED, "NewForCausalLM", "run M")
    depth, why = sweep_depth("auto", "NewForCausalLM", eager=lambda: False)
    assert depth == "self-check" and "lab-proven compiled for NewForCausalLM: run M)" in why
    assert sweep_depth("auto", "NewForCausalLM", eager=lambda: False, runner="v1")[0] == "full"
    assert "on the V2 runner at TP=1: run M" in sweep_depth(
        "self-check", "NewForCausalLM", eager=lambda: False, runner="v1")[1]
    assert "on the V2 runner at TP=1: run M" in sweep_depth(
        "self-check", "NewForCausalLM", eager=lambda: False, tensor_parallel_size=2)[1]
    monkeypatch.delitem(depth_rules.CUT_DOWN_PROVEN_COMPILED, "NewForCausalLM")
    assert "no proof has covered" in sweep_depth("cut-down", "NewForCausalLM",
                                                 eager=lambda: False)[1]
    monkeypatch.setitem(depth_rules.CUT_DOWN_PROVEN_COMPILED, "NewForCausalLM", "run M")
    assert "no proof" not in sweep_depth("cut-down", "NewForCausalLM", eager=lambda: False)[1]
    # the compiled proofs ran on the V2 runner at TP=1
    for kw in ({"runner": "v1"}, {"tensor_parallel_size": 2}):
        assert "no proof has covered" in sweep_depth("cut-down", "NewForCausalLM",
                                                     eager=lambda: False, **kw)[1]


def test_sweep_depth_walks_the_model_only_when_the_answer_could_be_cut_down():
    def never():
        raise AssertionError("asked whether the model runs eagerly")

    assert sweep_depth("full", "LlamaForCausalLM", eager=never)[0] == "full"
    assert sweep_depth("self-check", "NewForCausalLM", eager=never)[0] == "self-check"
    assert sweep_depth("prove", "NewForCausalLM", eager=never)[0] == "prove"


def test_the_graphs_vllm_compiles_by_size_are_read_from_its_compilation_config():
    """adapter/runner.compile_graph_ranges: compile sizes first (vLLM picks a size's graph before
    its range's), then the compile ranges; None where the config cannot be read."""
    import types

    from worstcase_profiler.adapter.runner import compile_graph_ranges

    def cfg(sizes, ends):
        def ranges():
            if ends is None:
                raise AttributeError("get_compile_ranges")
            starts = [0, *ends[:-1]]
            return [types.SimpleNamespace(start=s + 1, end=e) for s, e in zip(starts, ends)]

        cc = types.SimpleNamespace(compile_sizes=sizes, get_compile_ranges=ranges)
        return types.SimpleNamespace(compilation_config=cc)

    assert compile_graph_ranges(cfg(None, [8192])) == ((1, 8192),)
    assert compile_graph_ranges(cfg([8, 1, "x"], [256, 8192])) == ((1, 1), (8, 8), (1, 256),
                                                                   (257, 8192))
    assert compile_graph_ranges(cfg([], [])) is None
    assert compile_graph_ranges(cfg([], None)) is None

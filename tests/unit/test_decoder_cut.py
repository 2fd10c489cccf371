"""adapter/runner.decoder_cut on plain torch modules shaped like vLLM's decoders: which layers a
cut-down sweep keeps (the first of each kind; a prefix where a drafter reads early layers), how
a cut step runs only those and gives the decoder back whole, and every forward it refuses to
cut."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from worstcase_profiler.adapter.runner import decoder_cut  # noqa: E402


class Attn(torch.nn.Module):
    pass


class Linear(torch.nn.Module):
    pass


class Layer(torch.nn.Module):
    def __init__(self, mixer):
        super().__init__()
        self.mixer = mixer


class Decoder(torch.nn.Module):
    def __init__(self, mixers):
        super().__init__()
        self.layers = torch.nn.ModuleList(Layer(m()) for m in mixers)
        self.start_layer, self.end_layer = 0, len(mixers)


class Model(torch.nn.Module):
    def __init__(self, mixers):
        super().__init__()
        self.model = Decoder(mixers)


def test_the_cut_keeps_the_first_layer_of_every_kind():
    decoder, kept, total = decoder_cut(Model([Linear, Linear, Linear, Attn] * 2))
    assert (kept, total) == ((0, 3), 8) and decoder.end_layer == 8
    assert decoder_cut(Model([Attn] * 4))[1] == (0,)
    assert decoder_cut(Model([Attn, Linear, Linear, Attn]))[1] == (0, 1)


def test_sweep_depth_cut_down_keeps_the_prefix_its_lab_proofs_ran():
    """sweep_depth=cut-down checks nothing itself and rests on the lab's proofs, which cut to
    the shortest prefix holding every kind: it cuts there (cut_down(prefix=True)), and a model
    whose prefix is all of it is not cut that way."""
    from worstcase_profiler.adapter.runner import DriverBase

    assert decoder_cut(Model([Linear, Linear, Linear, Attn] * 2), prefix=True)[1] == (0, 1, 2, 3)
    with pytest.raises(ValueError, match="shortest prefix .* is all 6"):
        decoder_cut(Model([Linear] * 5 + [Attn]), prefix=True)
    assert decoder_cut(Model([Linear] * 5 + [Attn]))[1] == (0, 5)
    drv = DriverBase()
    drv.model = Model([Linear, Linear, Linear, Attn] * 2)
    with drv.cut_down(prefix=True) as depth:
        assert depth == "4 of 8 layers"


def test_a_cut_step_runs_only_the_kept_layers_in_order_and_gives_the_decoder_back():
    """The decoder's loop (islice(self.layers, start_layer, end_layer)) sees the kept layers
    alone, the same modules in their order; after the step, also a failed one, it holds every
    layer again."""
    from itertools import islice

    from worstcase_profiler.adapter.runner import DriverBase

    m = Model([Linear, Linear, Linear, Attn] * 2)
    layers = m.model.layers
    drv = DriverBase()
    drv.model = m
    seen = []

    def step():
        d = m.model
        seen.append([id(x) for x in islice(d.layers, d.start_layer, d.end_layer)])

    with drv.cut_down() as depth:
        assert depth == "2 of 8 layers (0, 3)"
        drv._at_depth(step)
        with pytest.raises(RuntimeError):
            drv._at_depth(lambda: (_ for _ in ()).throw(RuntimeError("step failed")))
    assert seen == [[id(layers[0]), id(layers[3])]]
    assert m.model.layers is layers and m.model.end_layer == 8
    assert [n for n, _ in m.model.named_children()] == ["layers"]


def test_the_runners_model_compile_cannot_be_cut():
    m = Model([Attn] * 4)
    m.compile()  # the runner's model.compile() (vLLM's STOCK_TORCH_COMPILE mode)
    with pytest.raises(ValueError, match="compiled"):
        decoder_cut(m)


def test_a_decoder_vllm_compiles_runs_its_cut_steps_eagerly_and_is_restored():
    """support_torch_compile's do_not_compile is set for a cut step only (the compiled graph
    would run every layer), and restored with end_layer after it, also when the step fails."""
    from worstcase_profiler.adapter.runner import DriverBase, runs_compiled

    m = Model([Attn] * 4)
    m.model.do_not_compile = False  # vLLM's own compilation
    assert runs_compiled(m)
    drv = DriverBase()
    drv.model = m
    seen = []
    with drv.cut_down() as depth:
        assert depth == "1 of 4 layers, run eagerly"
        drv._at_depth(lambda: seen.append((m.model.end_layer, m.model.do_not_compile)))
        with pytest.raises(RuntimeError):
            drv._at_depth(lambda: (_ for _ in ()).throw(RuntimeError("step failed")))
    assert seen == [(1, True)]
    assert (m.model.end_layer, m.model.do_not_compile) == (4, False)


def test_eager_full_bypasses_the_compiled_forward_at_full_depth_and_restores_it():
    """A compiled forward's full-model steps are read eagerly too (core/sweep._cut_down): every
    layer runs (end_layer untouched), the compiled graph bypassed, restored after, also when the
    step fails; on an eager model it changes nothing and says so."""
    from worstcase_profiler.adapter.runner import DriverBase

    m = Model([Attn] * 4)
    m.model.do_not_compile = False
    drv = DriverBase()
    drv.model = m
    seen = []
    with drv.eager_full() as compiled:
        assert compiled is True
        drv._at_depth(lambda: seen.append((m.model.end_layer, m.model.do_not_compile)))
        with pytest.raises(RuntimeError):
            drv._at_depth(lambda: (_ for _ in ()).throw(RuntimeError("step failed")))
    drv._at_depth(lambda: seen.append((m.model.end_layer, m.model.do_not_compile)))
    assert seen == [(4, True), (4, False)]
    plain = Model([Attn] * 4)
    drv.model = plain
    with drv.eager_full() as compiled:
        assert compiled is False


def test_no_cut_where_layers_are_all_different_or_split_by_pipeline_parallelism():
    with pytest.raises(ValueError, match="alike"):
        decoder_cut(Model([Linear, Attn]))
    m = Model([Attn] * 4)
    m.model.end_layer = 2
    with pytest.raises(ValueError, match="pipeline"):
        decoder_cut(m)


def test_a_compiling_parent_is_bypassed_with_the_decoder():
    """A parent module compiled with the decoder inside its graph (vLLM's Ernie 4.5 over its
    LlamaModel) would run every layer whatever the decoder's own flag says."""
    from worstcase_profiler.adapter.runner import DriverBase

    m = Model([Attn] * 4)
    m.do_not_compile = m.model.do_not_compile = False
    drv = DriverBase()
    drv.model = m
    seen = []
    with drv.cut_down():
        drv._at_depth(lambda: seen.append((m.do_not_compile, m.model.do_not_compile)))
    assert seen == [(True, True)] and (m.do_not_compile, m.model.do_not_compile) == (False, False)


def test_a_drafter_reading_middle_layers_keeps_the_full_sweep():
    m = Model([Attn] * 8)
    m.model.aux_hidden_state_layers = (2, 4, 5)  # EAGLE3's defaults for 8 layers
    with pytest.raises(ValueError, match="hidden states of layers"):
        decoder_cut(m)
    m.model.aux_hidden_state_layers = (1,)  # within what the cut keeps
    assert decoder_cut(m)[1] == (0,)
    # a drafter reading early layers: the prefix, so that the loop's numbering is the model's
    m = Model([Linear, Linear, Linear, Attn] * 2)
    m.model.aux_hidden_state_layers = (2,)
    assert decoder_cut(m)[1] == (0, 1, 2, 3)

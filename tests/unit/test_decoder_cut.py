"""adapter/runner.decoder_cut on plain torch modules shaped like vLLM's decoders: which prefix
of layers a cut-down sweep keeps, and every forward it refuses to cut."""

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


def test_the_cut_keeps_the_shortest_prefix_holding_every_kind_of_layer():
    decoder, keep, total = decoder_cut(Model([Linear, Linear, Linear, Attn] * 2))
    assert (keep, total) == (4, 8) and decoder.end_layer == 8


def test_a_compiled_forward_is_never_cut():
    m = Model([Attn] * 4)
    m.model.do_not_compile = False  # vLLM's own compilation
    with pytest.raises(ValueError, match="compiled"):
        decoder_cut(m)
    m = Model([Attn] * 4)
    m.compile()  # the runner's model.compile() (vLLM's STOCK_TORCH_COMPILE mode)
    with pytest.raises(ValueError, match="compiled"):
        decoder_cut(m)


def test_no_cut_where_layers_are_all_different_or_split_by_pipeline_parallelism():
    with pytest.raises(ValueError, match="alike"):
        decoder_cut(Model([Linear, Attn]))
    m = Model([Attn] * 4)
    m.model.end_layer = 2
    with pytest.raises(ValueError, match="pipeline"):
        decoder_cut(m)

"""``overcommit`` fixture: KV over-commit (reproduces seed 000, "the block
count divides by ONE layer per group while the runner allocates per layer").

Config ``draftgroup`` (issue 33) gives the layers two ``layer_types``: vLLM then
plans two KV groups (full attention, and a sliding-window "draft" group, as seed
000's ``fa_draft``), each seeing its first real layer only; both get one buffer
per real layer.

Architecture ``WcpOvercommitLlamaForCausalLM`` = vLLM's ``LlamaForCausalLM``
with ``num_hidden_layers`` (4 in the shipped config) REAL decoder layers, of
which only layer 0's ``Attention`` stays registered in
``compilation_config.static_forward_context``.  Layers 1.. are unregistered
and call layer 0's ``Attention`` module (the "placeholder"), so vLLM's KV
planning sees ONE attention layer in ONE group and sizes ``num_blocks =
budget // page_size_of_one_layer``.

When vLLM binds the placeholder's KV cache, the fixture allocates, per extra
real layer, one more buffer of the same shape/dtype (``torch.zeros``: written,
real RSS on the CPU), held as ``kv_cache`` on a ``WcpShadowKVCache`` module at
``model.layers.<i>.self_attn.wcp_shadow_kv``; plus a recurrent (GDN/Mamba-like)
state of ``max_num_seqs * wcp_recurrent_state_bytes_per_slot`` bytes, held as a
``(conv, ssm)`` tuple in ``kv_cache`` of ``WcpRecurrentState`` at
``wcp_recurrent_state``, that no KV budget sees.  So the allocated / budget
ratio is ~``num_hidden_layers`` (plus the recurrent state); see
``wcp_fixtures.rules.overcommit_expected_bytes``.  Binding an empty tensor
(vLLM's ``clear_layer_kv_caches`` / profiling-KV teardown) releases them.

The fixture does not refuse to start: the engine serves (the extra buffers are
not read by attention); deciding to refuse is the auditor's job.

vLLM hooks (v0.32 file:line; v0.26 status):

* KV binding: v0.32 ``v1/worker/utils.py:868 bind_kv_cache_to_layers`` calls
  ``layer.bind_kv_cache(kv)`` whose default
  (``model_executor/layers/attention_layer_base.py:27``) does
  ``self.kv_cache = kv``; v0.26 ``v1/worker/utils.py:537-538`` assigns
  ``forward_context[name].kv_cache = kv`` directly.  The fixture turns
  ``kv_cache`` into a property on the placeholder (class swap to a subclass), so
  both paths reach the hook.  Called from V1 ``initialize_kv_cache``
  (``v1/worker/gpu_model_runner.py`` v0.32 l.7055, allocation via
  ``v1/worker/utils.py:564 allocate_kv_cache``; v0.26 l.7562 via
  ``_allocate_kv_cache_tensors``/``_reshape_kv_cache_tensors``) and from the V2
  runner's ``attn_utils.init_kv_cache`` (v0.26 l.520), i.e. inside
  ``Worker.initialize_from_config`` (v0.32 ``gpu_worker.py:853``).
* Layer registration: ``Attention.__init__`` puts itself in
  ``compilation_config.static_forward_context[prefix]``
  (``model_executor/layers/attention/attention.py`` v0.32 l.443-445, v0.26
  l.446); the runner's ``get_kv_cache_spec`` (v0.32 ``gpu_model_runner.py:7146``,
  v0.26 l.7718) reads the layers found there, so removing the entry hides a
  layer from KV planning (all versions).
* Block count: v0.32 ``v1/core/kv_cache_utils.py:1520
  _get_kv_cache_bytes_per_block`` = sum of the group's per-layer pages (one
  layer here), used by ``get_kv_cache_config_from_groups`` (l.1588); v0.26
  ``get_num_blocks`` (l.990) = avail // page // group_size (1 here).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vllm.config import VllmConfig
from vllm.model_executor.models.llama import LlamaForCausalLM

from .scratch import wcp_config_dict


def _empty_like_placeholder() -> torch.Tensor:
    return torch.tensor([])


class WcpShadowKVCache(nn.Module):
    """One real layer's KV buffer that KV planning never counted."""

    def __init__(self, layer_index: int) -> None:
        super().__init__()
        self.layer_index = layer_index
        self.kv_cache: torch.Tensor = _empty_like_placeholder()


class WcpRecurrentState(nn.Module):
    """Recurrent (GDN/Mamba-like) per-slot state allocated outside the KV budget.

    ``kv_cache`` is a ``(conv_state, ssm_state)`` tuple the way vLLM's Mamba
    layers expose theirs (v0.32 ``bind_kv_cache`` gives a tuple of views)."""

    def __init__(self, max_num_seqs: int, bytes_per_slot: int) -> None:
        super().__init__()
        self.max_num_seqs = int(max_num_seqs)
        self.bytes_per_slot = int(bytes_per_slot)
        self.kv_cache: tuple[torch.Tensor, ...] = ()

    def allocate(self, device: torch.device) -> None:
        if self.bytes_per_slot <= 0 or self.max_num_seqs <= 0:
            self.kv_cache = ()
            return
        conv = self.bytes_per_slot // 4
        ssm = self.bytes_per_slot - conv
        self.kv_cache = (
            torch.zeros((self.max_num_seqs, conv), dtype=torch.uint8, device=device),
            torch.zeros((self.max_num_seqs, ssm), dtype=torch.uint8, device=device),
        )

    def release(self) -> None:
        self.kv_cache = ()


_PLACEHOLDER_CLASSES: dict[type, type] = {}


def _placeholder_class(base: type) -> type:
    """Subclass of the placeholder's Attention class whose ``kv_cache`` is a
    property: every binding (attribute assignment in v0.26, ``bind_kv_cache``
    in v0.32+) calls the owner's hook."""
    cls = _PLACEHOLDER_CLASSES.get(base)
    if cls is not None:
        return cls

    def _get(self):
        return self.__dict__.get("_wcp_bound_kv")

    def _set(self, value):
        self.__dict__["_wcp_bound_kv"] = value
        hook = self.__dict__.get("_wcp_on_bind")
        if hook is not None:
            hook(value)

    cls = type(f"WcpPlaceholder{base.__name__}", (base,), {"kv_cache": property(_get, _set)})
    _PLACEHOLDER_CLASSES[base] = cls
    return cls


class WcpOvercommitLlamaForCausalLM(LlamaForCausalLM):
    """One placeholder per KV group: per ``layer_types`` entry (one type, "full_attention", when
    the config has none), the first real layer of that type stays registered and the others
    call it. Config ``draftgroup``: four full-attention layers and two sliding-window layers (the
    "draft" group, a KV group of its own as seed 000's ``fa_draft``), so vLLM plans two groups
    of one layer each while the fixture allocates one buffer per real layer in both."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        hf = vllm_config.model_config.hf_config
        cfg = wcp_config_dict(hf)
        layers = self.model.layers
        start, end = self.model.start_layer, self.model.end_layer
        types = list(getattr(hf, "layer_types", None) or ["full_attention"] * (end - start))

        # Hide every real layer but the first of its type from KV planning; they call that
        # layer's attention (the group's placeholder) instead.
        sfc = vllm_config.compilation_config.static_forward_context
        placeholders: dict[str, Any] = {}
        shadows: dict[str, list[WcpShadowKVCache]] = {}
        self.wcp_shadows: list[WcpShadowKVCache] = []
        for i in range(start, end):
            kind = types[i]
            attn_i = layers[i].self_attn
            if kind not in placeholders:
                placeholders[kind] = attn_i.attn
                shadows[kind] = []
                continue
            sfc.pop(attn_i.attn.layer_name, None)
            attn_i.attn = placeholders[kind]
            attn_i.wcp_shadow_kv = WcpShadowKVCache(i)
            shadows[kind].append(attn_i.wcp_shadow_kv)
            self.wcp_shadows.append(attn_i.wcp_shadow_kv)

        self.wcp_recurrent_state = WcpRecurrentState(
            vllm_config.scheduler_config.max_num_seqs,
            int(cfg.get("wcp_recurrent_state_bytes_per_slot", 0)),
        )

        first = next(iter(placeholders))
        for kind, placeholder in placeholders.items():
            initial = placeholder.__dict__.pop("kv_cache", _empty_like_placeholder())
            placeholder.__class__ = _placeholder_class(type(placeholder))
            placeholder.__dict__["_wcp_bound_kv"] = initial
            placeholder.__dict__["_wcp_on_bind"] = (
                lambda kv, own=shadows[kind], state=(kind == first):
                self._wcp_on_placeholder_bound(kv, own, state))

    def _wcp_on_placeholder_bound(self, kv: Any, shadows: list[WcpShadowKVCache],
                                  owns_state: bool) -> None:
        if not isinstance(kv, torch.Tensor) or kv.numel() == 0:
            for shadow in shadows:
                shadow.kv_cache = _empty_like_placeholder()
            if owns_state:
                self.wcp_recurrent_state.release()
            return
        # One buffer of the placeholder's size per extra REAL layer of its group.
        for shadow in shadows:
            shadow.kv_cache = _empty_like_placeholder()  # drop the old one first
            shadow.kv_cache = torch.zeros(kv.shape, dtype=kv.dtype, device=kv.device)
        if owns_state:
            self.wcp_recurrent_state.release()
            self.wcp_recurrent_state.allocate(kv.device)

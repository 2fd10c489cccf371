"""vLLM-version shims shared by the fixtures (imported only inside engine
processes, never by ``register()``).

Hooks used, per vLLM version (paths relative to the ``vllm/`` package):

* ``v1/worker/workspace.py``
  - v0.32 (= v0.33): ``init_workspace_manager(device, num_ubatches=None,
    num_lanes=1, alloc_context=nullcontext)`` (l.307),
    ``is_workspace_manager_initialized`` (l.283), ``use_workspace_lane`` (l.38),
    ``WorkspaceManager._num_lanes`` / ``_current_workspaces`` (``__init__``
    l.56-76), ``get_simultaneous`` (l.181).
  - v0.26: ``init_workspace_manager(device, num_ubatches=None)`` (l.216),
    ``is_workspace_manager_initialized`` (l.194), ``get_simultaneous`` (l.92);
    there are NO lanes (no ``use_workspace_lane``, no ``num_lanes``).  The scratch
    fixture degrades to ONE lane there, so the "second lane never reserved" half
    of seed 002 cannot be reproduced on v0.26; the context-scaling half can.
* ``forward_context.py``: ``is_forward_context_available`` /
  ``get_forward_context`` (v0.32 l.217/208, v0.26 l.208/199).  Attention
  metadata is ``None`` in vLLM's stock profile step, a ``dict[layer_name ->
  metadata]`` in real and forced-attention dummy steps, or a ``list`` of such
  dicts (speculative decoding / ubatches; element 0 is the base model's, the
  way ``get_attention_context`` reads it).
* metadata fields: ``max_seq_len`` and ``num_actual_tokens`` exist on
  ``CPUAttentionMetadata`` (``v1/attention/backends/cpu_attn.py`` v0.32 l.110,
  v0.26 l.113), ``FlashAttentionMetadata`` (``flash_attn.py`` v0.32 l.513,
  v0.26 l.232) and
  ``TritonAttentionMetadata``; ``FlashInferMetadata`` keeps ``max_seq_len`` on its
  ``prefill`` / ``decode`` parts, which we also read; last resort ``seq_lens``.
"""

from __future__ import annotations

import inspect
from contextlib import nullcontext
from typing import Any

import torch

from vllm.v1.worker import workspace as _ws

HAS_LANES: bool = hasattr(_ws, "use_workspace_lane") and (
    "num_lanes" in inspect.signature(_ws.init_workspace_manager).parameters
)


def lane_context(lane: int | None):
    """``use_workspace_lane(lane)`` where lanes exist; a no-op otherwise or
    when ``lane`` is None (= stay on the current lane)."""
    if lane is None or not HAS_LANES:
        return nullcontext()
    return _ws.use_workspace_lane(lane)


def _manager_is_pristine(mgr: Any) -> bool:
    if getattr(mgr, "_locked", False):
        return False
    if any(t is not None for t in getattr(mgr, "_current_workspaces", [None])):
        return False
    return not any(getattr(mgr, "_persistent_resources", []) or [])


def ensure_workspace_manager(device: torch.device | str, want_lanes: int) -> int:
    """Make sure a WorkspaceManager exists; return the number of lanes usable.

    * none yet (vLLM's CPUWorker never creates one): create it with
      ``num_ubatches=1`` and ``want_lanes`` lanes (one on v0.26);
    * one with fewer lanes than wanted (the v0.32 GPU Worker creates 2 lanes only
      for DSpark): if nothing was allocated from it yet and it is unlocked,
      re-create it with ``want_lanes`` lanes, keeping its device, ubatch count and
      allocation context; otherwise keep it and use the lanes it has.
    """
    device = torch.device(device)
    if not _ws.is_workspace_manager_initialized():
        if HAS_LANES:
            _ws.init_workspace_manager(device, num_ubatches=1, num_lanes=want_lanes)
        else:  # v0.26: no lanes
            _ws.init_workspace_manager(device, num_ubatches=1)
    mgr = _ws.current_workspace_manager()
    have = int(getattr(mgr, "_num_lanes", 1))
    if HAS_LANES and have < want_lanes and _manager_is_pristine(mgr):
        _ws.init_workspace_manager(
            mgr._device,
            num_ubatches=mgr._num_ubatches,
            num_lanes=want_lanes,
            alloc_context=getattr(mgr, "_alloc_context", nullcontext),
        )
        mgr = _ws.current_workspace_manager()
        have = int(mgr._num_lanes)
    return min(have, want_lanes) if HAS_LANES else 1


def current_attn_metadata(layer_name: str) -> Any | None:
    """This layer's attention metadata in the current forward, or None."""
    from vllm.forward_context import get_forward_context, is_forward_context_available

    if not is_forward_context_available():
        return None
    md = get_forward_context().attn_metadata
    if md is None:
        return None
    if isinstance(md, list):
        if not md:
            return None
        md = md[0]
    if isinstance(md, dict):
        return md.get(layer_name)
    return md


def _as_int(x: Any) -> int | None:
    if x is None:
        return None
    if isinstance(x, torch.Tensor):
        if x.numel() == 0:
            return None
        return int(x.max().item())
    try:
        return int(x)
    except (TypeError, ValueError):
        return None


def metadata_rows(md: Any, fallback: int) -> int:
    rows = _as_int(getattr(md, "num_actual_tokens", None))
    return rows if rows is not None and rows > 0 else fallback


def metadata_kv_extent(md: Any, fallback: int) -> int:
    """The longest sequence (cached + new tokens) in the step's metadata."""
    ext = _as_int(getattr(md, "max_seq_len", None))
    if ext is None:  # FlashInfer: per-phase metadata
        parts = [getattr(md, p, None) for p in ("prefill", "decode")]
        vals = [_as_int(getattr(p, "max_seq_len", None)) for p in parts if p is not None]
        vals = [v for v in vals if v is not None]
        ext = max(vals) if vals else None
    if ext is None:
        for name in ("seq_lens_cpu", "seq_lens"):
            ext = _as_int(getattr(md, name, None))
            if ext is not None:
                break
    return ext if ext is not None and ext > 0 else fallback


def metadata_requests(md: Any, rows: int) -> tuple[list[int], list[int]] | None:
    """(query_lens, seq_lens) per request from ``query_start_loc`` and ``seq_lens`` (the common
    fields of the CPU, FlashAttention and Triton metadata), or None when the metadata lacks them."""
    qsl = getattr(md, "query_start_loc_cpu", None)
    if qsl is None:
        qsl = getattr(md, "query_start_loc", None)
    seq = getattr(md, "seq_lens_cpu", None)
    if seq is None:
        seq = getattr(md, "seq_lens", None)
    if not isinstance(qsl, torch.Tensor) or not isinstance(seq, torch.Tensor) or qsl.numel() < 2:
        return None
    starts = [int(x) for x in qsl.tolist()]
    query = [b - a for a, b in zip(starts, starts[1:])]
    # padded requests (graph padding) schedule no rows: drop them, and rows past the real ones
    lens = [int(x) for x in seq.tolist()[:len(query)]]
    pairs = [(q, s) for q, s in zip(query, lens) if q > 0]
    if not pairs or sum(q for q, _ in pairs) > rows:
        return None
    return [q for q, _ in pairs], [s for _, s in pairs]

"""``scratch`` / ``tile`` fixtures: context-scaled attention workspace on two
execution lanes (reproduces seed 002, "profiled peak does not bound a
long-context chunked prefill").

Architecture ``WcpScratchLlamaForCausalLM`` = vLLM's ``LlamaForCausalLM`` whose
decoder layers use ``WcpScratchLlamaAttention``.  Before the normal attention,
every layer asks vLLM's WorkspaceManager for scratch:

* the step carries attention metadata (a real step, or a profiler's synthetic
  step with ``force_attention``): ``rows`` = tokens in the step
  (``num_actual_tokens``), ``kv_extent`` = longest sequence in the metadata
  (``max_seq_len``), and the layer requests ``scratch_bytes(rows, kv_extent,
  cfg)`` bytes on lane ``layer_index % 2`` (inside ``use_workspace_lane``);
* no attention metadata (vLLM's stock ``profile_run``): only the rows-only
  amount ``scratch_bytes(rows, 1, cfg)`` on the CURRENT lane (lane 0).

So a stock profile sees a tiny lane-0 slot and never touches lane 1, and the
first long chunked prefill grows both lanes to ``scratch_bytes(chunk,
context)``: growth that happens after the KV budget was fixed.  The scratch is
written (``fill_``) so it is real memory on the CPU, where untouched pages do
not count in RSS.

Configs (``wcp_fixtures.model_dir(name)``):

* ``scratch``: rule ``linear``, 2 layers, 64 B per row x token:
  ``scratch = rows * kv_extent * 64``.  With ``max_model_len=2048`` and
  ``max_num_batched_tokens=256`` a max-length request needs 256*2048*64 =
  32 MiB per lane (64 MiB over the two lanes); the stock profile sees 16 KiB.
* ``decode``: rule ``decode``, 2 layers, 4096 B per token read: a pure-decode
  step needs ``sum(seq_lens) * 4096`` (4 requests at 2048 tokens: 32 MiB per
  lane), any step with a prefill row only ``rows * 4096`` (1 MiB at 256 rows).
* ``wide``: rule ``wide``, 2 layers, 1024 B: ``n_prefill * sum(prefill
  seq_lens) * 1024`` (4 prefill requests at 2048 tokens: 32 MiB per lane; one
  request at 2048: 2 MiB).
* ``deepdecode``: rule ``linear`` at 0 B (no workspace), 2 layers, plus the deep-layer
  transient (``rules.deep_transient_bytes``): layer 1, the one a cut-down sweep drops,
  allocates ``sum(seq_lens) * 4096`` bytes on pure-decode steps of at least 3 requests (4
  requests at 2048 tokens: 32 MiB), nothing on any other step or in layer 0.  The cut-down
  sweep's adversary (issue 34): its self-check must fall back to the full sweep.
* ``tile``: rule ``tile`` (see ``wcp_fixtures.rules``), 2 layers, 32 B per row x
  token, tiers ``[[256, 64, 2], [288, 96, 3], [null, 32, 1]]``.  Meant to run
  with **max_num_batched_tokens = 512** and max_model_len = 2048.  The scratch
  as a function of rows peaks on ``rows = 257..288`` (brute-force argmax 257,
  neither a power of two nor 512): 54 MiB at kv_extent 2048, against 32 MiB at
  rows = 512 and at rows = 256 (margin 22 MiB).

vLLM hooks (v0.32 file:line; v0.26 status):

* ``LlamaForCausalLM(vllm_config, prefix, layer_type)`` and
  ``LlamaDecoderLayer(..., attn_layer_type)``:
  ``model_executor/models/llama.py:464/251`` (v0.26: 446/248, same API).
* WorkspaceManager: ``v1/worker/workspace.py`` (see ``_compat``).  The CPUWorker
  (``v1/worker/cpu_worker.py:107-177``) never creates one, so the fixture does,
  at model construction, with 2 lanes.  v0.26 has no lanes: ONE lane is used.
* Forward-context metadata: see ``_compat``.

Eager only: the Python-side workspace calls are not torch.compile-traceable, so
run with ``enforce_eager=True`` (CompilationMode.NONE); a warning is logged
otherwise.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import torch

from vllm.config import VllmConfig
from vllm.logger import init_logger
from vllm.model_executor.models.llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
)
from vllm.model_executor.models.utils import extract_layer_index

from . import _compat
from .rules import deep_transient_bytes, step_scratch_bytes

logger = init_logger(__name__)

# Recent requests: (layer_index, lane, rows, kv_extent, nbytes, had_metadata).
# Lane is the lane used (None = "current lane", the metadata-less path).
SCRATCH_LOG: deque[tuple[int, int | None, int, int, int, bool]] = deque(maxlen=4096)
# The deepdecode rule's transients: (layer_index, requests, nbytes).
DEEP_LOG: deque[tuple[int, int, int]] = deque(maxlen=4096)


def wcp_config_dict(hf_config: Any) -> dict[str, Any]:
    """The ``wcp_*`` fields of an HF config as a plain dict (for ``rules``)."""
    d = hf_config.to_dict() if hasattr(hf_config, "to_dict") else dict(vars(hf_config))
    return {k: v for k, v in d.items() if k.startswith("wcp_")}


class WcpScratchLlamaAttention(LlamaAttention):
    """LlamaAttention that first takes (and writes) workspace scratch."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        config = kwargs.get("config", args[0] if args else None)
        self.wcp_cfg = wcp_config_dict(config)
        self.wcp_layer_index = extract_layer_index(kwargs.get("prefix", ""))
        self.wcp_want_lanes = int(self.wcp_cfg.get("wcp_scratch_lanes", 2))
        self.wcp_fill_byte = (self.wcp_layer_index % 251) + 1

    def _wcp_take_scratch(self, hidden_states: torch.Tensor) -> None:
        lanes = _compat.ensure_workspace_manager(hidden_states.device, self.wcp_want_lanes)
        md = _compat.current_attn_metadata(self.attn.layer_name)
        n_tokens = int(hidden_states.shape[0])
        if md is None:
            rows, kv_extent, lane = n_tokens, 1, None
            nbytes = step_scratch_bytes([rows], [1], self.wcp_cfg)
        else:
            rows = _compat.metadata_rows(md, n_tokens)
            kv_extent = _compat.metadata_kv_extent(md, rows)
            lane = self.wcp_layer_index % lanes
            per_request = None
            if self.wcp_cfg.get("wcp_scratch_rule") in ("decode", "wide"):
                per_request = _compat.metadata_requests(md, rows)
            if per_request is None:  # linear/tile, or no per-request fields: the step's extent
                per_request = ([rows], [kv_extent])
            nbytes = step_scratch_bytes(*per_request, self.wcp_cfg)
            if self.wcp_cfg.get("wcp_deep_bytes_per_token"):
                self._wcp_deep_transient(md, rows, hidden_states.device)
        SCRATCH_LOG.append((self.wcp_layer_index, lane, rows, kv_extent, nbytes, md is not None))
        if nbytes <= 0:
            return
        from vllm.v1.worker.workspace import current_workspace_manager

        with _compat.lane_context(lane):
            (buf,) = current_workspace_manager().get_simultaneous(((nbytes,), torch.uint8))
            buf.fill_(self.wcp_fill_byte)  # real memory, not untouched pages

    def _wcp_deep_transient(self, md: Any, rows: int, device: torch.device) -> None:
        """The ``deepdecode`` rule: a layer the cut-down decoder drops allocates, writes and
        frees a tensor on wide pure-decode steps (rules.deep_transient_bytes)."""
        per_request = _compat.metadata_requests(md, rows)
        if per_request is None:
            return
        nbytes = deep_transient_bytes(self.wcp_layer_index, *per_request, self.wcp_cfg)
        DEEP_LOG.append((self.wcp_layer_index, len(per_request[0]), nbytes))
        if nbytes > 0:
            buf = torch.empty(nbytes, dtype=torch.uint8, device=device)
            buf.fill_(self.wcp_fill_byte)  # real memory, not untouched pages
            del buf

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        self._wcp_take_scratch(hidden_states)
        return super().forward(positions, hidden_states)


class WcpScratchDecoderLayer(LlamaDecoderLayer):
    def __init__(self, vllm_config: VllmConfig, prefix: str = "", config: Any = None) -> None:
        super().__init__(
            vllm_config=vllm_config,
            prefix=prefix,
            config=config,
            attn_layer_type=WcpScratchLlamaAttention,
        )


class WcpScratchLlamaForCausalLM(LlamaForCausalLM):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__(
            vllm_config=vllm_config, prefix=prefix, layer_type=WcpScratchDecoderLayer
        )
        cfg = wcp_config_dict(vllm_config.model_config.hf_config)
        want = int(cfg.get("wcp_scratch_lanes", 2))
        lanes = _compat.ensure_workspace_manager(vllm_config.device_config.device, want)
        if lanes < want:
            logger.warning(
                "wcp_fixtures scratch: WorkspaceManager offers %d lane(s), wanted %d%s",
                lanes,
                want,
                "" if _compat.HAS_LANES else " (this vLLM has no workspace lanes)",
            )
        try:
            from vllm.config import CompilationMode

            if vllm_config.compilation_config.mode != CompilationMode.NONE:
                logger.warning(
                    "wcp_fixtures scratch is eager-only; use enforce_eager=True"
                )
        except Exception:  # noqa: BLE001 - advisory only
            pass

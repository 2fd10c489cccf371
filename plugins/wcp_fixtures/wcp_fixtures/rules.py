"""Pure sizing rules of the fixtures (no torch, no vLLM imports).

Tests and the profiler's own checks import these to compute, exactly, what a
fixture will allocate.  Every function takes the fixture's ``config.json`` as a
plain dict (only the ``wcp_*`` keys and a few standard Llama keys are read).

Scratch fixtures (``scratch``, ``tile``, ``decode``, ``wide``)
--------------------------------------------------------------
``scratch_bytes(rows, kv_extent, cfg)`` is the byte count one attention layer
requests from vLLM's WorkspaceManager in one step, where ``rows`` is the number
of tokens in the step and ``kv_extent`` is the largest sequence length (cached
+ new tokens) in the step's attention metadata.  When a step has no attention
metadata (vLLM's stock profile step) the fixture calls it with
``kv_extent=1`` (the "rows-only" amount).

* rule ``"linear"`` (config ``scratch``)::

      scratch = rows * kv_extent * wcp_scratch_bytes_per_row_token

* rule ``"tile"`` (config ``tile``): a kernel-plan-like rule whose row tile and
  KV-split count depend on ``rows`` (``wcp_tile_tiers``: ``[max_rows, tile,
  splits]``, first tier with ``rows <= max_rows`` wins, ``max_rows`` ``null`` =
  unbounded)::

      scratch = round_up(rows, tile(rows)) * splits(rows) * kv_extent
                * wcp_scratch_bytes_per_row_token

  It is a non-monotone step function of ``rows``.  With the shipped tiers
  ``[[256, 64, 2], [288, 96, 3], [null, 32, 1]]`` the peak is the plateau
  ``rows = 257..288`` (864 row-units), while ``rows = 256`` and ``rows = 512``
  (the shipped ``max_num_batched_tokens``) both give 512 row-units; at
  ``kv_extent = 2048`` and 32 B/row/token that is 54 MiB against 32 MiB.

* rule ``"decode"`` (config ``decode``): a split-KV decode kernel whose scratch
  scales with the KV the step reads, only on pure-decode steps (every request
  schedules one row)::

      scratch = sum(seq_lens) * B          if max(query_lens) == 1
              = rows * B                   otherwise

  Its worst step is the widest decode batch at full context, which no single
  prefill chunk reaches.

* rule ``"wide"`` (config ``wide``): per-request prefill tiles over every
  prefill request's KV, so a prefill spread over many requests needs the square
  of their count::

      scratch = n_prefill * sum(seq_lens of prefill requests) * B
      (n_prefill = requests scheduling more than one row; rows * B when none)

  Its worst step is a multi-request prefill with every request at full context.

Deep-layer transient (config ``deepdecode``, any rule)
-----------------------------------------------------
``deep_transient_bytes(layer_index, query_lens, seq_lens, cfg)``: a layer at index
``wcp_deep_from_layer`` or deeper (one a cut-down sweep's decoder drops: it keeps
one layer of each kind, layer 0 here) allocates, writes and frees a plain tensor
(transient memory, not workspace) on pure-decode steps of at least
``wcp_deep_min_reqs`` requests only::

      transient = sum(seq_lens) * wcp_deep_bytes_per_token
                  if layer_index >= from_layer and max(query_lens) == 1
                  and len(query_lens) >= min_reqs, else 0

It is the adversary of the cut-down sweep's assumption (issue 34): the full
model's worst step is a wide decode batch the cut decoder never sees as heavy.

``step_scratch_bytes(query_lens, seq_lens, cfg)`` is the per-request form every
rule answers (linear and tile read ``rows = sum(query_lens)`` and ``kv_extent =
max(seq_lens)``).

The WorkspaceManager rounds every request up to 256 bytes; a slot that served a
request of ``n`` bytes holds ``workspace_slot_bytes(n)`` bytes.

Overcommit fixture (``overcommit``)
-----------------------------------
vLLM sizes the KV block count against ONE visible attention layer, while the
fixture allocates one buffer of that size per real decoder layer, plus a
recurrent state of ``max_num_seqs * wcp_recurrent_state_bytes_per_slot`` that
no KV budget sees.  ``overcommit_expected_bytes`` gives the total.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Sequence

WORKSPACE_ALIGN = 256  # vllm/v1/worker/workspace.py get_simultaneous: round_up(actual, 256)


def _round_up(x: int, m: int) -> int:
    return ((x + m - 1) // m) * m


def workspace_slot_bytes(nbytes: int) -> int:
    """Bytes a WorkspaceManager slot holds after serving one ``nbytes`` request."""
    return _round_up(int(nbytes), WORKSPACE_ALIGN)


def bytes_per_row_token(cfg: Mapping[str, Any]) -> int:
    return int(cfg["wcp_scratch_bytes_per_row_token"])


def tile_plan(rows: int, cfg: Mapping[str, Any]) -> tuple[int, int]:
    """(tile_rows, kv_splits) the ``tile`` rule picks for ``rows``."""
    for max_rows, tile, splits in cfg["wcp_tile_tiers"]:
        if max_rows is None or rows <= int(max_rows):
            return int(tile), int(splits)
    raise ValueError(f"wcp_tile_tiers has no tier for rows={rows}; end with a null bound")


def linear_scratch_bytes(rows: int, kv_extent: int, cfg: Mapping[str, Any]) -> int:
    """``rows * kv_extent * bytes_per_row_token``."""
    return int(rows) * int(kv_extent) * bytes_per_row_token(cfg)


def tile_scratch_bytes(rows: int, kv_extent: int, cfg: Mapping[str, Any]) -> int:
    """``round_up(rows, tile) * splits * kv_extent * bytes_per_row_token``."""
    tile, splits = tile_plan(rows, cfg)
    return _round_up(int(rows), tile) * splits * int(kv_extent) * bytes_per_row_token(cfg)


def scratch_bytes(rows: int, kv_extent: int, cfg: Mapping[str, Any]) -> int:
    """Scratch bytes ONE attention layer requests for a step of ``rows`` tokens
    whose longest sequence is ``kv_extent`` tokens (dispatch on
    ``cfg["wcp_scratch_rule"]``, default ``"linear"``)."""
    if rows <= 0:
        return 0
    kv_extent = max(1, int(kv_extent))
    rule = cfg.get("wcp_scratch_rule", "linear")
    if rule == "linear":
        return linear_scratch_bytes(rows, kv_extent, cfg)
    if rule == "tile":
        return tile_scratch_bytes(rows, kv_extent, cfg)
    raise ValueError(f"unknown wcp_scratch_rule {rule!r}")


def step_scratch_bytes(query_lens: Sequence[int], seq_lens: Sequence[int],
                       cfg: Mapping[str, Any]) -> int:
    """Scratch bytes ONE attention layer requests for a step whose requests schedule
    ``query_lens`` rows on sequences of ``seq_lens`` tokens (cached + new), per rule."""
    q = [int(x) for x in query_lens]
    k = [max(1, int(x)) for x in seq_lens]
    if len(q) != len(k):
        raise ValueError(f"{len(q)} query lengths for {len(k)} sequence lengths")
    rows = sum(q)
    if rows <= 0:
        return 0
    rule = cfg.get("wcp_scratch_rule", "linear")
    b = bytes_per_row_token(cfg)
    if rule == "decode":
        return sum(k) * b if max(q) == 1 else rows * b
    if rule == "wide":
        prefill = [s for n, s in zip(q, k) if n > 1]
        return len(prefill) * sum(prefill) * b if prefill else rows * b
    return scratch_bytes(rows, max(k), cfg)


def deep_transient_bytes(layer_index: int, query_lens: Sequence[int],
                         seq_lens: Sequence[int], cfg: Mapping[str, Any]) -> int:
    """Transient bytes layer ``layer_index`` allocates (and frees) in one step: the
    ``deepdecode`` rule (0 where ``wcp_deep_bytes_per_token`` is unset)."""
    per_token = int(cfg.get("wcp_deep_bytes_per_token", 0))
    q = [int(x) for x in query_lens]
    if (per_token <= 0 or not q or int(layer_index) < int(cfg.get("wcp_deep_from_layer", 1))
            or max(q) != 1 or len(q) < int(cfg.get("wcp_deep_min_reqs", 1))):
        return 0
    return sum(max(1, int(s)) for s in seq_lens) * per_token


def brute_force_argmax(
    n: int, kv_extent: int, cfg: Mapping[str, Any]
) -> tuple[int, int]:
    """(rows, bytes): the smallest ``rows`` in ``1..n`` maximising
    ``scratch_bytes(rows, kv_extent, cfg)``."""
    best_rows, best = 0, -1
    for rows in range(1, int(n) + 1):
        b = scratch_bytes(rows, kv_extent, cfg)
        if b > best:
            best_rows, best = rows, b
    return best_rows, best


# ----------------------------------------------------------------- overcommit


def attention_page_bytes(
    cfg: Mapping[str, Any], block_size: int, dtype_bytes: int = 2
) -> int:
    """KV page bytes of ONE full-attention layer: ``block_size * 2 (K,V) *
    num_kv_heads * head_dim * dtype_bytes`` (vLLM FullAttentionSpec.page_size_bytes
    for an unquantised cache)."""
    head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])
    kv_heads = int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
    return int(block_size) * 2 * kv_heads * head_dim * int(dtype_bytes)


def overcommit_real_layers(cfg: Mapping[str, Any]) -> int:
    return int(cfg["num_hidden_layers"])


def recurrent_state_bytes(cfg: Mapping[str, Any], max_num_seqs: int) -> int:
    """Bytes of the recurrent state allocated beside (outside) the KV budget."""
    return int(max_num_seqs) * int(cfg.get("wcp_recurrent_state_bytes_per_slot", 0))


def overcommit_num_blocks(
    budget_bytes: int, cfg: Mapping[str, Any], block_size: int, dtype_bytes: int = 2
) -> int:
    """The block count vLLM plans when only ONE attention layer is visible."""
    return int(budget_bytes) // attention_page_bytes(cfg, block_size, dtype_bytes)


def overcommit_expected_bytes(
    budget_bytes: int,
    cfg: Mapping[str, Any],
    *,
    max_num_seqs: int,
    block_size: int,
    dtype_bytes: int = 2,
    num_blocks: int | None = None,
) -> int:
    """Total bytes the overcommit fixture holds for a KV budget of
    ``budget_bytes``: ``real_layers * num_blocks * page + max_num_seqs *
    wcp_recurrent_state_bytes_per_slot``, where ``num_blocks = budget // page``
    unless the engine's actual ``num_blocks`` is passed."""
    page = attention_page_bytes(cfg, block_size, dtype_bytes)
    if num_blocks is None:
        num_blocks = int(budget_bytes) // page
    return (
        overcommit_real_layers(cfg) * int(num_blocks) * page
        + recurrent_state_bytes(cfg, max_num_seqs)
    )

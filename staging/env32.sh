# Source on the GPU host after staging the vLLM 0.32 parts: the offline vLLM importable, and what
# it needs there (flashinfer is not staged: its sampler stays off).
export SITE=${SITE:-/tmp/site32}
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export VLLM_USE_FLASHINFER_SAMPLER=${VLLM_USE_FLASHINFER_SAMPLER:-0}

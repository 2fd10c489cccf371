#!/usr/bin/env bash
# Issue 32, point 3, on the H200 once the 0.32 stack and its extra piece (TileLang) are staged:
# seed 002's failing step rebuilt from real requests through `vllm serve` (bench/serve_run.py),
# stock first, then `--profiler worstcase` on the same traffic, each on a card held by a ballast
# to what --gpu-memory-utilization 0.5 requests plus 256 MiB (how production holds a card).
# DeepSeek-V4 (tests/gpu/models/dsv4-4l-mtp) + DSpark k=3 at the seed's limits (bench/gpu_suite.py
# dsv4_dspark_*), FULL_AND_PIECEWISE graphs (EAGER=1: --enforce-eager). Traffic: one prompt of
# 150,016 tokens, prefilled in 4,096-token chunks and cached; then that prefix plus 3,840 new
# tokens, which hits 149,760 and computes 4,096 (DSpark's group drops a 256-token block of the
# hit): the seed's 4,096-token chunk on 149,760 cached tokens (tests/cpu/test_dsv4_dspark_config.py
# checks it in vLLM's own KVCacheManager); 4 decodes; the same step again beside 4 decodes.
# vLLM's workspace debug log is on (a resize after the lock shows in serve-*.log).
#   bash staging/serve_dsv4.sh [MODES]     # default stock,worstcase; writes $OUT/serve/
# Settings: OUT (required), SITE (/tmp/site213), DEADLINE_S (1400: modes not started by then are
# skipped), START_S (900: a server not healthy by then is stopped), EAGER=1.
# VISION=1 (issue 36, point 4): seed 002's own VLM instead (tests/gpu/models/dsv4-vision-4l,
# DeepseekV4ForConditionalGeneration) on the V1 runner without a drafter (the encoder step's
# proven path: bench/gpu_suite.py dsv4vl_*), --disable-chunked-mm-input as the seed's build, and
# the image traffic after the text's: the 150,016-token text cached, then the same text with
# IMAGES (9, of 387 tokens each) distinct images after it, one step computing them on ~150k cached
# tokens (serve_run --images; the servers get the fixture's tokenizer and a pass-through chat
# template). Nine, not the ten one step's encoder budget runs: with --disable-chunked-mm-input
# the uncached text tail (up to a 256-token block and the re-tokenised end) and ten images
# (3,870 tokens) can pass 4,096, and the last image would wait for the next step. The ten-image
# step runs in dsv4vl_* (--validate). Not yet run on a GPU.
set -uo pipefail
export SITE=${SITE:-/tmp/site213}
# shellcheck disable=SC1091
source staging/env32.sh
export PYTHONPATH=$PWD:$PWD/plugins/wcp_fixtures:$PYTHONPATH VLLM_DEBUG_WORKSPACE=1
# Expandable segments, as production on a held card needs (h200-run54 vs -run57; without them both
# servers died of CUDA OOMs with memory reserved but unusable in h200-run70). The ballast keeps
# the default allocator (serve_run). PYTORCH_CUDA_ALLOC_CONF= (empty) opts out.
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF-expandable_segments:True}
python3 staging/install_entrypoint.py --target "$SITE" --fixtures >/dev/null || exit 1
EXTRA='--max-num-seqs 4 --block-size 256 --kv-cache-dtype fp8_ds_mla --enable-prefix-caching'
MODEL=tests/gpu/models/dsv4-4l-mtp
images=()
if [ "${VISION:-0}" = 1 ]; then
  MODEL=tests/gpu/models/dsv4-vision-4l
  export VLLM_USE_V2_MODEL_RUNNER=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
  EXTRA+=" --disable-chunked-mm-input --limit-mm-per-prompt '{\"image\":10}'"
  # vLLM's DeepSeek-V4 renderer renders the chat request with the model's own encoding, not
  # serve_run's --chat-template and content format: tests/cpu/test_dsv4_vision_fixture.py checks it
  images=(--images "${IMAGES:-9}" --image-px 1024)
else
  EXTRA+=" --speculative-config '{\"method\":\"dspark\",\"num_speculative_tokens\":3}'"
fi
# the seed's step measured on its own and, before serving, built from requests against that
# reading (check_steps; serve_run keeps the profiler's settings off the stock server)
EXTRA+=" --additional-config '{\"worstcase_profiler\":{\"check_steps\":[\"4096@149760\"]}}'"
if [ "${EAGER:-0}" = 1 ]; then
  eager=(--eager)
else
  eager=()
  EXTRA+=" --compilation-config '{\"cudagraph_mode\":\"FULL_AND_PIECEWISE\"}'"
fi
exec python3 bench/serve_run.py --out "${OUT:?set OUT}/serve" --model "$MODEL" "${images[@]}" \
  --modes "${1:-stock,worstcase}" --hold-slack-mib 256 --util 0.5 \
  --max-model-len 262144 --max-num-batched-tokens 4096 \
  --prefix 150016 --chunk 3840 --decodes 4 --decode-prompt 1024 --decode-tokens 64 \
  --start-timeout-s "${START_S:-900}" --deadline $(( $(date +%s) + ${DEADLINE_S:-1400} )) \
  "${eager[@]}" --extra "$EXTRA"

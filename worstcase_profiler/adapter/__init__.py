"""Every touch of vLLM internals lives in this package (each marked `# vllm-touch: NAME` and
catalogued in patches.REGISTRY).

  versions.py          which vLLM is installed, and the feature probes the rest branch on
  patches.py           the registry of touches and the installers of the monkeypatches
  startup.py           the worker's start-up, hook by hook: measure, let the core decide, apply
  facts.py             what the worker is: limits, rank, device, engine config, cache-key facts
  meters.py            how one step's peak is read, per device
  runner.py            StepDriver over vLLM's V1 model runner (synthetic steps at KV extent)
  runner_v2.py         StepDriver over the V2 model runner
  warmup.py            what warm-up will keep, measured before the KV budget is fixed
  kv.py                KV spec arithmetic and the allocation audit
  workspace.py         WorkspaceManager slots: read, grow to the worst case, lock
  advice.py            the chunk advisor's measurements
  multimodal.py        a multimodal encoder: vLLM's limits, its own profile's encoder runs, the
                       encoder step beside the sweep
  validation.py        `wcprof --validate`: real requests, each rank's peak
  serve_validation.py  the same check under `vllm serve`, before traffic
  guard.py             the production guard: each served step against the prediction
"""

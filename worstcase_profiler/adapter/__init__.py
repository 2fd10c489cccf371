"""Every touch of vLLM internals lives in this package.

  versions.py   which vLLM is installed, and the feature probes the rest branch on
  patches.py    the monkeypatches, each documented (what, why, which versions)
  runner.py     StepDrivers over vLLM's V1 and V2 model runners (synthetic steps at KV extent)
  engine.py     the worker-side flow: sweep -> admission -> report, KV audit, workspace lock
  kv.py         KV spec arithmetic and the allocation audit
  workspace.py  WorkspaceManager slots: read, grow to the worst case, lock
"""

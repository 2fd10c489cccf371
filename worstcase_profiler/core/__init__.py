"""The pure core: which steps to run, why every rows value is covered, what is safe to admit, and
the start-up rules, over frozen values of its own (types.py). Nothing here imports vLLM or torch;
the adapter (worstcase_profiler/adapter) measures, this decides, report.py projects.

  types        the vocabulary: Shape, StepResult, SweepResult, Admission, audits, phase results
  shapes       the steps the scheduler can form, from the engine limits
  coverage     the chord certificate that covers every rows value 1..N
  sweep        the sweep's order of work over a StepDriver, and a cached sweep's replay
  admission    the budget arithmetic and the budget decision
  multimodal   a multimodal encoder's limits, its encoder step in the admitted transient, and
               the report's warning for the limits not profiled
  cache_trust  whether a cached sweep, replayed now, may stand in for a full one
  audits       what KV initialisation and warm-up kept, against what admission set aside
  replay_rules rank agreement, the step a replay formed, when it stops, when it fails
  sweep_depth  cut down or full, the evidence tables, and the cut-down proof
  cache        sweeps kept across starts (own versioned layout), codec its encoding
  session      one worker's start-up: settings, facts and the phase results, each set once
  timing       start-up phase seconds
"""

"""The pure core: which steps to run, why every rows value is covered, what is safe to admit, and
the start-up policy, over frozen values of its own (types.py). Nothing here imports vLLM or torch;
the adapter (worstcase_profiler/adapter) measures, this decides, report.py projects.

  types       the vocabulary: Shape, StepResult, SweepResult, Admission, audits, phase results
  shapes      the steps the scheduler can form, from the engine limits
  coverage    the chord certificate that covers every rows value 1..N
  sweep       the sweep's order of work over a StepDriver, and a cached sweep's replay
  admission   the budget arithmetic
  policy      start-up decisions: budget, cache reuse, KV audit, warm-up audit, rank agreement
  cache       sweeps kept across starts (own versioned layout), codec its encoding
  session     one worker's start-up: settings, facts and the phase results, each set once
  timing      start-up phase seconds
"""

"""worstcase_profiler: size vLLM's KV cache from the worst step the scheduler can form.

Layout (results flow one way: measure -> decide -> report -> render):
  core/        the pure core (no vLLM, no torch): shapes, coverage, sweep, admission, the
               start-up rules (cache trust, audits, replay rules, sweep depth), cache, the
               start-up session over frozen values of its own
  adapter/     every touch of vLLM, each catalogued in adapter/patches.py: the hooks
               (startup.py), step drivers and meters, KV and workspace measurements
  report.py    the public JSON schema and its projection from a session
  render/      the view model and one reporter per format (terminal, json, html, png)
  commands/    one module per `wcprof` command, and the engine start they share (engine_boot.py)
  cli.py       `wcprof`'s entry point: dispatches to commands/, maps errors to exit codes
  plugin.py    the vllm.general_plugins entry point
"""

__version__ = "0.1.0"

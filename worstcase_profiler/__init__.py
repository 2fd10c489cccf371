"""worstcase_profiler: size vLLM's KV cache from the worst step the scheduler can form.

Layout (pure core first, vLLM last):
  sizes, errors, settings      small vocabulary shared by everything
  shapes, coverage, admission  the maths: which steps to run, why every rows value is covered,
                               how much KV is safe
  meters                       how a step's peak is measured (CUDA allocator, CPU VmHWM)
  report, render/              the pydantic report and one renderer per output format
  adapter/                     every touch of vLLM internals, each patch documented
  plugin, cli                  the vLLM general plugin and the `wcprof` command
"""

__version__ = "0.1.0"

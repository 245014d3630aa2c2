# Two commands on a fresh machine:  `make train` (the default experiment)  and  `make test`.
# Each creates .venv and installs what it needs the first time.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
ARGS ?=

.PHONY: install install-all browser train test test-fast bench learning-curve lint clean

install: $(VENV)/.installed  ## what training needs
# what the tests and benchmarks need besides: llama.cpp compiles (both cores) while pip installs the rest (-j2)
install-all:
	$(MAKE) -j2 $(VENV)/.llama-server

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# torch first, pinned: `pip install torch==2.13.0` takes the local CPU build; an unpinned torch pulls CUDA wheels.
$(VENV)/.installed: pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

# llama.cpp (llama-cpp-python, the judge tests' OpenAI-compatible server; no prebuilt wheel on PyPI) compiles for
# this CPU (-march=native) with AMX left out: virtual machines that advertise AMX without enabling it die at its
# first tile instruction (SIGILL, seen on 2-core Xeon machines here). Built without pip's wheel cache, which may hold
# an AMX build, and without the multimodal library (LLAVA_BUILD=OFF: mtmd, which nothing here loads).
NO_AMX := -mno-amx-tile -mno-amx-int8 -mno-amx-bf16
LLAMA_CMAKE_ARGS := -DLLAVA_BUILD=OFF $(if $(filter x86_64 amd64,$(shell uname -m)),-DCMAKE_C_FLAGS='$(NO_AMX)' -DCMAKE_CXX_FLAGS='$(NO_AMX)')
LLAMA_WHEELS := $(VENV)/llama-wheel
$(LLAMA_WHEELS)/.built: | $(VENV)/bin/python
	rm -rf $(LLAMA_WHEELS)
	@echo "make: compiling llama.cpp (a few minutes; log: $(VENV)/llama-build.log)"
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PY) -m pip wheel --no-deps --no-cache-dir -w $(LLAMA_WHEELS) \
		"llama-cpp-python>=0.3.36" > $(VENV)/llama-build.log 2>&1 || { tail -30 $(VENV)/llama-build.log; exit 1; }
	touch $@

$(VENV)/.llama-server: $(VENV)/.installed $(LLAMA_WHEELS)/.built
	$(PY) -m pip install --quiet "$$(ls $(LLAMA_WHEELS)/llama_cpp_python-*.whl)[server]"
	touch $@

# The trackio dashboard test opens the dashboard in a real headless browser: Debian's Chromium, installed once
# (through sudo when not root). Without apt (or when the install fails) it says why and the test skips, saying why.
BROWSERS := chromium chromium-browser google-chrome google-chrome-stable
browser:
	@if (for b in $(BROWSERS); do command -v $$b >/dev/null 2>&1 && exit 0; done; exit 1); then \
		:; \
	elif ! command -v apt-get >/dev/null 2>&1; then \
		echo "make browser: no Chromium and no apt-get here: the trackio dashboard test will skip"; \
	else \
		sudo=$$([ "$$(id -u)" = 0 ] || echo "sudo -n"); \
		echo "make browser: installing chromium (apt-get) for the trackio dashboard test"; \
		$$sudo apt-get install -y -qq chromium >/dev/null 2>&1 \
			|| { $$sudo apt-get update -qq && $$sudo apt-get install -y -qq chromium >/dev/null; } \
			|| echo "make browser: could not install chromium: the trackio dashboard test will skip"; \
	fi

train: install  ## the default experiment: GRPO on the embedded SmolLM2-135M, offline arithmetic (~11 min on 2 cores)
	$(PY) -m grpo_exp.train $(ARGS)

test: install-all browser  ## the whole suite, slow tests included (the CI command)
	$(PY) -m ruff check src support tests benchmarks
	$(PY) -m ruff format --check src support tests benchmarks
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet --site-dir site
	$(PY) -m pytest $(ARGS)

test-fast: install  ## without the embedded model (slow) and the end-to-end runs through the CLI (e2e)
	$(PY) -m pytest -m "not slow and not e2e" $(ARGS)

bench: install-all  ## benchmarks (ratios side by side in one run; ~1.5 h, most of it time to accuracy); results in BENCHMARKS.md
	$(PY) -m benchmarks.rewards
	$(PY) -m benchmarks.judge
	$(PY) -m benchmarks.group_stats
	$(PY) -m benchmarks.p_yes
	$(PY) -m benchmarks.tool_protocol
	$(PY) -m benchmarks.multiturn_speed
	$(PY) -m benchmarks.overhead
	$(PY) -m benchmarks.decode
	$(PY) -m benchmarks.heldout_eval
	$(PY) -m benchmarks.time_to_accuracy

# What the default experiment learns: 3 seeds of `make train`, then held-out accuracy (mean, spread) and a figure.
CURVE_DIR ?= outputs/learning_curve
learning-curve: install  ## ~35 min on 2 cores; results in BENCHMARKS.md, figure in experiments/
	$(PY) -m grpo_exp.train -m trainer.seed=42,43,44 hydra.sweep.dir=$(CURVE_DIR) $(ARGS)
	$(PY) -m benchmarks.learning_curve $(CURVE_DIR) --out experiments/learning_curve.png

lint: install
	$(PY) -m ruff check src support tests benchmarks
	$(PY) -m ruff format --check src support tests benchmarks

clean:
	rm -rf outputs multirun .pytest_cache site

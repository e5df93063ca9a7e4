# Two commands for a newcomer:  `make hub`  (start the embedded hub)  and  `make test`.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(CURDIR)/node_modules/.bin:$(PATH)
PYTEST_ARGS ?=
# test workers (pytest-xdist; a test file runs on one worker, so module fixtures stay shared);
# most tests wait on hubs, kernels and browsers, so two halve the suite's time on 2 cores
TEST_WORKERS ?= 2

.PHONY: test hub deps bench clean browser-deps prometheus-deps labextension

deps: $(VENV)/.installed node_modules/.bin/configurable-http-proxy

# The JupyterLab extension (labextension/, TypeScript) is built here with the npm toolchain of
# package.json into gpupool/lab/labextension/, which the Python package ships. An editable install
# skips a package's data files (a setuptools limitation), so the last two lines enable the server
# extension and link the lab extension into the venv, as `jupyter labextension develop` does.
LABEXT := gpupool/lab/labextension
LABEXT_SRC := labextension/package.json labextension/tsconfig.json $(wildcard labextension/src/*.ts labextension/style/*.css)
JUPYTER_DATA := $(VENV)/share/jupyter/labextensions
JUPYTER_CONF := $(VENV)/etc/jupyter/jupyter_server_config.d

$(VENV)/.installed: pyproject.toml $(LABEXT)/package.json
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip "setuptools>=68" wheel
	$(PY) -m pip install -q -e '.[test]'
	mkdir -p $(JUPYTER_DATA) $(JUPYTER_CONF)
	ln -sfn $(CURDIR)/$(LABEXT) $(JUPYTER_DATA)/gpupool-lab
	cp gpupool/lab/etc/gpupool-lab.json $(JUPYTER_CONF)/
	@touch $@

# the builder needs JupyterLab's core package.json (its shared packages): jupyterlab's own, from the venv
$(LABEXT)/package.json: $(LABEXT_SRC) node_modules/.bin/configurable-http-proxy
	@test -x $(PY) || python3 -m venv $(VENV)
	@$(PY) -c 'import jupyterlab' 2>/dev/null || $(PY) -m pip install -q 'jupyterlab>=4'
	node_modules/.bin/tsc -p labextension
	node node_modules/@jupyterlab/builder/lib/build-labextension.js \
	  --core-path "$$($(PY) -c 'import jupyterlab, os; print(os.path.join(os.path.dirname(jupyterlab.__file__), "staging"))')" labextension
	@touch $@

labextension: $(LABEXT)/package.json

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
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

hub: deps
	$(VENV)/bin/gpupool hub --demo

bench: deps
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) node_modules build dist *.egg-info .pytest_cache $(LABEXT) labextension/lib

# Two commands set everything up on a fresh machine (Python >= 3.11 is the only prerequisite):
#   make demo   - embedded broker + worker + a seller and a buyer buying three privacy steps
#   make test   - lint, type-check and the whole test suite (what CI runs)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test test-fast install install-node serve bench report soak schemas vectors clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed

# the Node.js client (clients/node), installed from its lock file; tests/streams/clients/test_node_client.py
# runs it and skips with a reason when node or these modules are missing
NODE_CLIENT := clients/node
$(NODE_CLIENT)/node_modules/.installed: $(NODE_CLIENT)/package.json $(NODE_CLIENT)/package-lock.json
	@if command -v npm >/dev/null; then \
		npm ci --prefix $(NODE_CLIENT) --no-audit --no-fund && touch $@; \
	else \
		echo "npm not found: the Node client (clients/node) is not installed and its tests are skipped"; \
	fi

install-node: $(NODE_CLIENT)/node_modules/.installed

demo: $(VENV)/.installed
	$(PY) -m streams demo

serve: $(VENV)/.installed
	$(PY) -m streams serve

test: $(VENV)/.installed $(NODE_CLIENT)/node_modules/.installed
	$(PY) -m ruff check market streams tests bench
	$(PY) -m ruff format --check market streams tests bench
	$(PY) -m mypy
	$(PY) -m pytest -n 4 --dist worksteal  # 4 processes on 2 cores: most tests wait on workers

# the loop to run while editing (under a minute on an idle 2-core machine): every test that needs
# no broker and is not marked slow (statistical, fuzz and subprocess-heavy tests), two processes
test-fast: $(VENV)/.installed
	$(PY) -m pytest -n 2 -m "not broker and not slow" --durations=5 tests market

bench: $(VENV)/.installed
	$(PY) -m bench.noise
	$(PY) -m bench.state
	$(PY) -m bench.service
	$(PY) -m bench.flood
	$(PY) -m bench.scale

report: $(VENV)/.installed
	$(PY) -m bench.report

soak: $(VENV)/.installed
	$(PY) -m bench.soak

schemas: $(VENV)/.installed
	$(PY) -m streams schemas --out docs/schemas

# the protocol's test vectors (docs/protocol.md §10), checked by tests/streams/wire/test_protocol_spec.py
vectors: $(VENV)/.installed
	$(PY) -m streams vectors --out docs/vectors

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis data $(NODE_CLIENT)/node_modules

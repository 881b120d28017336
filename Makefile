# Two commands do everything on a fresh machine: `make test` and `make bench`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup test bench lint clean

setup: $(STAMP)

# The streaming engine (gpufeed[streaming]) goes in last without its dependencies: those the tests use are in the
# dev extra; its cloud SDKs (Azure, GCS, OCI) are not used offline and take a minute to install.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,plot]'
	$(PY) -m pip install --quiet --no-deps 'streaming-community>=0.14.2,<0.15'
	touch $(STAMP)

# Bytecode first: the machine sets PYTHONDONTWRITEBYTECODE, so without it every process the tests start (about 200:
# scripts under diagnose, torchrun ranks, the CLI) compiles gpufeed's modules again (0.6 s each).
test: setup
	$(PY) -m compileall -q -j 0 src benchmarks tests/watch/scripts > /dev/null
	$(PY) -m pytest -q -n auto --dist worksteal

bench: setup
	$(VENV)/bin/gpufeed bench --out bench-out
	$(PY) benchmarks/loader_throughput.py --out bench-out
	$(PY) benchmarks/image_folder.py --out bench-out
	$(PY) benchmarks/augment_recipes.py --out bench-out
	$(PY) benchmarks/image_sizes.py --out bench-out
	$(PY) benchmarks/stream_throughput.py --out bench-out

lint: setup
	$(PY) -m ruff check src tests benchmarks
	$(PY) -m ruff format --check src tests benchmarks
	$(PY) -m mypy

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .ruff_cache .hypothesis

# `make run` and `make test` each set up a fresh machine first (scripts/setup.sh is idempotent).
PY := .venv/bin/python

.PHONY: setup run test
setup:
	@scripts/setup.sh

run: setup
	$(PY) scripts/demo_layer_norm.py

test: setup
	PIPELINE_REQUIRE_GPU=1 $(PY) -m pytest -q

# The two commands a new user runs (see README). Both install first; installing is idempotent.
VENV ?= .venv
export HF_HUB_OFFLINE = 1
export TRANSFORMERS_OFFLINE = 1
export OMP_NUM_THREADS ?= 1
export RAY_USAGE_STATS_ENABLED = 0

.PHONY: install demo test
install:
	RAGSIFT_VENV=$(VENV) bash cluster/install.sh

demo: install
	$(VENV)/bin/ragsift demo --force

test: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider --durations=25

# Developer and CI entry points. `run` installs what serving needs (the project and its
# runtime dependencies); `test`, `lint`, `bench` and `install` add the test extras
# (pytest, playwright, ruff, mypy, ...). Each makes .venv when missing and installs again
# only when pyproject.toml changed since its own stamp: a checkout that ran `make run`
# gets the extras on its first `make test`, and `make run` after `make test` installs
# nothing (the extras include everything running needs, so that install stamps both).

VENV := .venv
PYTHON := $(VENV)/bin/python
RUN_STAMP := $(VENV)/.installed-run
TEST_STAMP := $(VENV)/.installed-test
# The interpreter .venv is made from: the distribution's CPython when it is 3.11 or newer
# and can make venvs, else the first python3 on PATH. Distributions build CPython with
# profile-guided and link-time optimisation; a plain source build (pyenv's default, what
# python3 is on these machines) has neither and ran this server 15-25% slower (same code,
# same hour: reads 6,200-6,700/s vs 4,800-5,100/s, HL7 ingest 124-126 vs 104-112 msg/s).
# `make PYTHON3=/path/to/python3` picks another; an existing .venv is kept as it is.
PYTHON3 ?= $(shell /usr/bin/python3 -c 'import sys, venv, ensurepip; \
	sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1 && echo /usr/bin/python3 || echo python3)

.PHONY: install run test lint bench clean

install: $(TEST_STAMP)

$(PYTHON):
	$(PYTHON3) -m venv $(VENV)

$(RUN_STAMP): pyproject.toml | $(PYTHON)
	$(PYTHON) -m pip install -e .
	touch $(RUN_STAMP)

$(TEST_STAMP): pyproject.toml | $(PYTHON)
	$(PYTHON) -m pip install -e '.[test]'
	touch $(RUN_STAMP) $(TEST_STAMP)

run: $(RUN_STAMP)
	$(VENV)/bin/healthplatform serve

test: install
	$(PYTHON) -m pytest -q -n 2
	$(VENV)/bin/ruff check

lint: install
	$(VENV)/bin/ruff check
	$(VENV)/bin/mypy

bench: install
	@set -e; for script in bench/*.py; do \
		[ -e "$$script" ] || continue; \
		echo "== $$script"; \
		$(PYTHON) "$$script"; \
	done

# Keeps .venv: it is slow to rebuild and not a build product.
clean:
	rm -rf build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

# Developer and CI entry points. `install` is the one prerequisite of the others: it
# makes .venv when missing and reinstalls the project only when pyproject.toml changed.

VENV := .venv
PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install run test lint bench clean

install: $(STAMP)

$(PYTHON):
	python3 -m venv $(VENV)

$(STAMP): pyproject.toml | $(PYTHON)
	$(PYTHON) -m pip install -e '.[test]'
	touch $(STAMP)

run: install
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

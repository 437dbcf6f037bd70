# gptkit: `make demo` runs the whole job end to end, `make test` the test suite.
# Each target sets up .venv on first use (and again when pyproject.toml or constraints.txt
# changes), with the exact tested versions of constraints.txt.

VENV    ?= .venv
PYTHON  := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
# The public datasets and vocabularies: ../shared/data beside the checkout when it exists, else
# data/, which `make demo` fills from the datasets' public sources (gptkit data fetch).
DATA    ?= $(if $(wildcard ../shared/data),$(abspath ../shared/data),$(abspath data))
RUNS    ?= runs

.PHONY: setup demo test bench lint clean

$(STAMP): pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PYTHON) -m pip install -q --upgrade pip
	$(PYTHON) -m pip install -q -c constraints.txt -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

test: $(STAMP)
	GPTKIT_DATA=$(DATA) $(PYTHON) -m pytest

demo: $(STAMP)
	@test -d "$(DATA)/gutenberg" || $(PYTHON) -m gptkit data fetch --demo --out "$(DATA)"
	GPTKIT_DATA=$(DATA) $(PYTHON) -m gptkit demo --data $(DATA) --out $(RUNS)/demo

bench: $(STAMP)
	@for b in benchmarks/*.py; do GPTKIT_DATA=$(DATA) $(PYTHON) $$b || exit 1; done

lint: $(STAMP)
	$(PYTHON) -m ruff check src tests benchmarks
	$(PYTHON) -m ruff format --check src tests benchmarks

clean:
	rm -rf $(RUNS) .pytest_cache

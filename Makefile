# minou: `make run` starts a broker, `make test` runs the whole suite.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
APT    := $(shell command -v apt-get 2>/dev/null)
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: run test lint bench clean system-deps

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	rm -f $(VENV)/.installed-*
	touch $@

## run: create .venv, install minou, start a broker on ./data (Ctrl-C stops it)
run: $(STAMP)
	$(BIN)/minou start --data ./data

## system-deps: Debian packages the tests need (none yet beyond Python)
system-deps:
	@true

## test: install what the tests need, lint, and run the whole suite
test: $(STAMP) system-deps
	$(BIN)/ruff check src tests bench
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check src tests bench

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache

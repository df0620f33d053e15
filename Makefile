# make demo   set up, then run the main job end to end on an embedded Redis
# make test   set up, then lint (Python and Rust) + typecheck + all tests (what CI runs)
VENV := .venv/bin
PYTEST_ARGS ?=

.PHONY: setup demo test lint typecheck pytest proto format

setup:
	./scripts/setup.sh

demo: setup
	./scripts/demo.sh

test: setup lint typecheck pytest

lint:
	$(VENV)/ruff check .
	$(VENV)/ruff format --check .
	./scripts/lint_rust.sh

typecheck:
	$(VENV)/mypy

pytest:
	$(VENV)/pytest -q $(PYTEST_ARGS)

proto:
	$(VENV)/python scripts/gen_proto.py

format:
	$(VENV)/ruff format .
	$(VENV)/ruff check --fix .
	cd native && cargo fmt

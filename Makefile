# make demo   set up, then run the main job end to end on an embedded Redis
# make wheel  build the wheel (Rust extension compiled) into dist/
# make test   set up, then lint (Python and Rust) + typecheck + alert rules + the Rust unit
#             tests + all tests (what CI runs)
VENV := .venv/bin
PYTEST_ARGS ?=

.PHONY: setup demo test lint typecheck rules rusttest pytest proto format wheel

setup:
	./scripts/setup.sh

demo: setup
	./scripts/demo.sh

test: setup lint typecheck rules rusttest pytest

lint:
	$(VENV)/ruff check .
	$(VENV)/ruff format --check .
	./scripts/lint_rust.sh
	cd clients/go && test -z "$$(gofmt -l .)" && go vet ./...

typecheck:
	$(VENV)/mypy

rules:
	promtool check rules deploy/prometheus/rules.yml
	promtool test rules deploy/prometheus/rules_test.yml

rusttest:
	./scripts/test_rust.sh

pytest:
	$(VENV)/pytest -q $(PYTEST_ARGS)

wheel: setup
	./scripts/wheel.sh

proto:
	$(VENV)/python scripts/gen_proto.py

format:
	$(VENV)/ruff format .
	$(VENV)/ruff check --fix .
	cd native && cargo fmt

# The two commands of the README: `make run` and `make test`. Both install what is
# missing (Debian packages), configure and build, then run.
BUILD ?= build
JOBS  ?= 2
CONFIG ?= configs/demo.yaml

.PHONY: all deps configure build run test test-all bench clean

all: build

deps:
	@scripts/install-deps

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release

configure: deps $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j$(JOBS)

run: build
	$(BUILD)/halotrain train $(CONFIG)

# CPU machines run everything but the GPU tests; `make test-all` on a GPU machine.
test: build
	cd $(BUILD) && ctest --output-on-failure -LE gpu --timeout 600

test-all: build
	cd $(BUILD) && ctest --output-on-failure --timeout 600

bench: build
	bench/run-all $(BUILD)

clean:
	rm -rf $(BUILD)

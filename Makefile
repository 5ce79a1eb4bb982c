# gdsfs. `make demo` mounts a demo tree (host staging, no GPU needed);
# `make test` runs unit and integration tests (root and /dev/fuse for the
# integration tier). The GPU tier is `make test-gpu` on a machine with one.

GO      ?= go
BIN     := bin
PREFIX  ?= /usr/local
BINDIR  ?= $(PREFIX)/bin
MANDIR  ?= $(PREFIX)/share/man
SBINDIR ?= /sbin
UNITDIR ?= /etc/systemd/system
BUILD   ?= $(shell git describe --always --dirty 2>/dev/null)
LDFLAGS := -X github.com/gdsfs/gdsfs.Build=$(BUILD)
DEMO    ?= /tmp/gdsfs-demo
# The Python tests want a python3 that can import torch (the autoloader's
# tests fail without it in CI): Debian's python3-torch is /usr/bin/python3's.
PYTHON  ?= $(shell for p in python3 /usr/bin/python3; do $$p -c 'import torch' >/dev/null 2>&1 && { echo $$p; exit 0; }; done; echo python3)

.PHONY: all build install uninstall demo deps test lint test-gpu gpu-bundle bench clean

all: build

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/gdsfs ./cmd/gdsfs

# The binary, the mount helper mount(8) runs for type fuse.gdsfs (a link to
# the binary), the systemd unit gdsfs@.service with its example
# environment file, and the man pages. DESTDIR stages it for a package.
install: build
	install -D -m 0755 $(BIN)/gdsfs $(DESTDIR)$(BINDIR)/gdsfs
	install -d $(DESTDIR)$(SBINDIR)
	ln -sf $(BINDIR)/gdsfs $(DESTDIR)$(SBINDIR)/mount.fuse.gdsfs
	install -d $(DESTDIR)$(UNITDIR) $(DESTDIR)/etc/gdsfs
	sed 's|/usr/local/bin/gdsfs|$(BINDIR)/gdsfs|g' 'deploy/systemd/gdsfs@.service' > '$(DESTDIR)$(UNITDIR)/gdsfs@.service'
	install -m 0644 deploy/systemd/example.env $(DESTDIR)/etc/gdsfs/example.env.sample
	$(BIN)/gdsfs man --dir $(DESTDIR)$(MANDIR)/man8
	@echo "installed; mount with: gdsfs mount --daemon SOURCE MOUNTPOINT, an fstab line of type fuse.gdsfs, or systemctl enable --now gdsfs@NAME (/etc/gdsfs/NAME.env)"

uninstall:
	rm -f $(DESTDIR)$(BINDIR)/gdsfs $(DESTDIR)$(SBINDIR)/mount.fuse.gdsfs '$(DESTDIR)$(UNITDIR)/gdsfs@.service' \
		$(DESTDIR)/etc/gdsfs/example.env.sample $(DESTDIR)$(MANDIR)/man8/gdsfs*.8

# The Python client as a wheel users install into their environment
# (pip install $(WHEELDIR)/gdsfs-*.whl; python/README.md). Its version is
# python/gdsfs/VERSION, the release the binary embeds and reports. Built
# offline (Debian's python3-setuptools and python3-wheel) from a copy of
# python/ without the tests.
WHEELDIR ?= $(BIN)/wheel
.PHONY: wheel
wheel:
	@rm -rf '$(WHEELDIR)' && mkdir -p '$(WHEELDIR)'
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	cp -r python/pyproject.toml python/README.md python/gdsfs "$$tmp"/ && \
	find "$$tmp" -name __pycache__ -prune -exec rm -rf {} + && \
	$(PYTHON) -m pip wheel -q --no-build-isolation --no-deps --no-index -w '$(WHEELDIR)' "$$tmp"
	@ls '$(WHEELDIR)'/gdsfs-*.whl

# Mounts $(DEMO)/src on $(DEMO)/mnt in the foreground with the embedded
# default configuration. In another terminal: cat $(DEMO)/mnt/.gdsfs/stats
demo: build
	@mkdir -p $(DEMO)/src/shards $(DEMO)/mnt
	@for i in 0 1 2 3; do [ -f $(DEMO)/src/shards/shard-$$i.bin ] || \
		head -c 33554432 /dev/urandom > $(DEMO)/src/shards/shard-$$i.bin; done
	@echo "hello from gdsfs" > $(DEMO)/src/hello.txt
	@echo "Mounting $(DEMO)/src on $(DEMO)/mnt (Ctrl-C unmounts). Try, in another terminal:"
	@echo "  cat $(DEMO)/mnt/hello.txt; cat $(DEMO)/mnt/shards/* > /dev/null"
	@echo "  cat $(DEMO)/mnt/.gdsfs/stats $(DEMO)/mnt/.gdsfs/cache"
	$(BIN)/gdsfs mount $(DEMO)/src $(DEMO)/mnt

lint:
	@test -z "$$(gofmt -l .)" || { echo "gofmt needed:"; gofmt -l .; exit 1; }
	$(GO) vet ./...
	$(GO) tool staticcheck ./...
	$(GO) mod tidy -diff
	cd deploy/kubernetes/validate && $(GO) vet ./... && $(GO) mod tidy -diff

# The Debian packages the tests need, installed where missing (root, apt).
deps:
	@sh .ci/deps

test: deps lint
	$(GO) test -race -count=1 -timeout 18m ./...
	cd deploy/kubernetes/validate && $(GO) test -count=1 ./...
	$(PYTHON) -m unittest discover -s python/tests -v

# Test binaries for the GPU machine (it has no Go): built here into .bin/.
gpu-bundle:
	@mkdir -p .bin
	$(GO) build -ldflags "$(LDFLAGS)" -o .bin/gdsfs ./cmd/gdsfs
	$(GO) test -c -o .bin/cuda.test ./gpu/cuda
	$(GO) test -c -o .bin/gpustaging.test ./staging/gputest
	CGO_ENABLED=0 $(GO) build -o .bin/leasecheck ./integration/leasecheck
	$(GO) build -o .bin/loopback github.com/hanwen/go-fuse/v2/example/loopback
	cp scripts/test-gpu.sh scripts/mount-gpu.sh scripts/torch-gpu.sh scripts/check-gpu.sh scripts/cufile-stats-gpu.sh scripts/lease-gpu.sh scripts/multigpu-gpu.sh scripts/outdir.sh scripts/autoload-gpu.py scripts/gpuscript.py scripts/restart-gpu.py scripts/make-safetensors-fixtures.py scripts/step-verdict.py .bin/
	-cp ../shared/device/cufile-compat.sh .bin/ 2>/dev/null

# On the GPU machine: every GPU test, which fails (never skips) where no GPU
# answers. Builds the bundle first where Go is installed.
test-gpu:
	@if command -v $(GO) >/dev/null 2>&1; then $(MAKE) gpu-bundle; fi
	sh .bin/test-gpu.sh

# Read throughput native vs gdsfs vs go-fuse's loopback example, with and
# without passthrough, stat of 10,000 files, and the staging paths.
bench: build
	$(GO) build -o $(BIN)/loopback github.com/hanwen/go-fuse/v2/example/loopback
	$(BIN)/gdsfs bench mount --loopback $(BIN)/loopback
	$(BIN)/gdsfs bench stage

clean:
	rm -rf $(BIN) .bin

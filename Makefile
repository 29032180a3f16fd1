# The two commands of the README: `make demo` and `make test`. Both install
# what they need (PostgreSQL server binaries) and work as root.

GO        ?= go
# go.mod names the toolchain (a Go patch release without the standard
# library's known vulnerabilities) and requires at least the release that
# fixed them. With auto, an older installed Go fetches it through the
# module proxy once; a GOTOOLCHAIN set in the environment wins.
export GOTOOLCHAIN ?= auto
# package:target:executions run by `make fuzz` (and so by `make test`),
# each about 5 s on a 2-core machine. Budgets are counts, not durations:
# Go 1.26's fuzzing coordinator can report its own -fuzztime deadline as a
# failure ("context deadline exceeded", no failing input; fixed in Go
# 1.27), and a count has no deadline. FUZZTIME, when set (10s, 100000x),
# overrides every budget.
FUZZTIME  ?=
FUZZ      := payment:FuzzParseAmount:30000x payment:FuzzParseAmountMinor:60000x \
             payment:FuzzDestinationACH:60000x payment:FuzzDestinationSEPA:50000x \
             payment:FuzzDestinationWire:40000x payment:FuzzDecodePayload:60000x \
             pending:FuzzValidate:10000x \
             cmd/outbox:FuzzEnqueueLine:4000x
BENCHTIME ?= 1x

.PHONY: demo test vet lint vulndb fuzz bench postgres pgbouncer promtool chromium strace build

## demo: local PostgreSQL, migrations, relayer, sandbox rail, a producer stream, a live summary
demo: postgres
	$(GO) run ./cmd/outbox demo $(ARGS)

## test: go vet, every test with the race detector, then short fuzz runs
## (the PgBouncer, promtool, browser and strace tests must run: a missing
## binary fails them)
test: postgres pgbouncer promtool chromium strace vet lint
	OUTBOX_REQUIRE_PGBOUNCER=1 OUTBOX_REQUIRE_PROMTOOL=1 OUTBOX_REQUIRE_CHROMIUM=1 OUTBOX_REQUIRE_STRACE=1 $(GO) test -race -count=1 -timeout 30m ./...
	$(MAKE) --no-print-directory fuzz

vet:
	$(GO) vet ./...

## lint: staticcheck and govulncheck, pinned as tools in go.mod (fetched
## through the module proxy). govulncheck checks against GOVULNDB when set,
## else vuln.go.dev, else (that host unreachable) the newest
## golang.org/x/vulndb module through the module proxy, else the snapshot
## of it in tools/vulndb, and says which it used.
lint:
	$(GO) tool staticcheck ./...
	@./tools/govulncheck.sh $(GO)

## vulndb: refresh the vulnerability database snapshot of tools/vulndb
## from the newest golang.org/x/vulndb module (the repository vuln.go.dev
## is built from) through the Go module proxy (GOPROXY may name a mirror).
vulndb:
	@set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	dl=$$(cd "$$tmp" && $(GO) mod download -json golang.org/x/vulndb@latest); \
	dir=$$(echo "$$dl" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$$/\1/p'); \
	version=$$(echo "$$dl" | sed -n 's/^[[:space:]]*"Version": "\(.*\)",$$/\1/p'); \
	day=$$(echo "$$version" | sed -n 's/^v0\.0\.0-\([0-9]\{4\}\)\([0-9]\{2\}\)\([0-9]\{2\}\).*/\1-\2-\3/p'); \
	n=$$(ls "$$dir/data/osv" | grep -c '\.json$$'); \
	(cd "$$dir/data/osv" && tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="$$day" -cf - *.json) | gzip -n -9 > tools/vulndb/go-vulndb.tar.gz; \
	echo "golang.org/x/vulndb $$version data/osv ($$day), $$n entries" > tools/vulndb/VERSION; \
	cat tools/vulndb/VERSION

fuzz:
	@for pf in $(FUZZ); do \
		pkg=$${pf%%:*}; rest=$${pf#*:}; f=$${rest%%:*}; budget=$${rest#*:}; \
		[ -z "$(FUZZTIME)" ] || budget="$(FUZZTIME)"; \
		echo "fuzz ./$$pkg $$f ($$budget)"; \
		$(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $$budget ./$$pkg || exit 1; \
	done

## bench: Go benchmarks (numbers for the closing notes; never timed unit tests)
bench: postgres
	OUTBOX_TEST_FSYNC=on $(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) ./...

build:
	$(GO) build -o bin/outbox ./cmd/outbox

## chromium: make sure a headless Chromium exists (the console's browser
## test drives it).
chromium:
	@if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then exit 0; fi; \
	echo "chromium not found: installing the chromium package"; \
	SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q && \
	$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium

## strace: make sure strace exists (the export's fsync test traces the
## command's system calls).
strace:
	@if command -v strace >/dev/null 2>&1; then exit 0; fi; \
	echo "strace not found: installing the strace package"; \
	SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q && \
	$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends strace

## promtool: make sure promtool exists (the alert rules' tests run it).
promtool:
	@if command -v promtool >/dev/null 2>&1; then exit 0; fi; \
	echo "promtool not found: installing the prometheus package"; \
	SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q && \
	$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus

## postgres: make sure PostgreSQL server binaries exist (tests and the demo
## start their own clusters from them); skipped when a database URL is given.
postgres:
	@if [ -n "$$OUTBOX_TEST_DATABASE_URL$$OUTBOX_PG_BINDIR" ] || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then \
		exit 0; \
	fi; \
	echo "PostgreSQL server binaries not found: installing the postgresql package"; \
	SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q && \
	$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql

## pgbouncer: make sure the pgbouncer binary exists (the tests start their
## own, in front of their throwaway cluster).
pgbouncer:
	@if command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ]; then exit 0; fi; \
	echo "pgbouncer not found: installing the pgbouncer package"; \
	SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q && \
	$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q pgbouncer

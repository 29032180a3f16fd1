# The two commands of the README: `make demo` and `make test`. Both install
# what they need (PostgreSQL server binaries) and work as root.

GO        ?= go
# package:target:executions run by `make fuzz` (and so by `make test`),
# each about 5 s on a 2-core machine. Budgets are counts, not durations:
# Go 1.26's fuzzing coordinator can report its own -fuzztime deadline as a
# failure ("context deadline exceeded", no failing input; fixed in Go
# 1.27), and a count has no deadline. FUZZTIME, when set (10s, 100000x),
# overrides every budget.
FUZZTIME  ?=
FUZZ      := payment:FuzzParseAmount:30000x payment:FuzzParseAmountMinor:60000x \
             payment:FuzzDestinationACH:60000x payment:FuzzDestinationSEPA:50000x \
             payment:FuzzDestinationWire:40000x pending:FuzzValidate:10000x \
             cmd/outbox:FuzzEnqueueLine:4000x
BENCHTIME ?= 1x

.PHONY: demo test vet lint fuzz bench postgres pgbouncer promtool chromium build

## demo: local PostgreSQL, migrations, relayer, sandbox rail, a producer stream, a live summary
demo: postgres
	$(GO) run ./cmd/outbox demo $(ARGS)

## test: go vet, every test with the race detector, then short fuzz runs
## (the PgBouncer, promtool and browser tests must run: a missing binary
## fails them)
test: postgres pgbouncer promtool chromium vet lint
	OUTBOX_REQUIRE_PGBOUNCER=1 OUTBOX_REQUIRE_PROMTOOL=1 OUTBOX_REQUIRE_CHROMIUM=1 $(GO) test -race -count=1 -timeout 30m ./...
	$(MAKE) --no-print-directory fuzz

vet:
	$(GO) vet ./...

## lint: staticcheck and govulncheck, pinned as tools in go.mod (fetched
## through the module proxy). govulncheck needs its vulnerability database
## (vuln.go.dev, or a copy named by GOVULNDB); where neither is reachable it
## says so and is skipped, any other failure or finding fails.
lint:
	$(GO) tool staticcheck ./...
	@out=$$($(GO) tool govulncheck $(if $(GOVULNDB),-db $(GOVULNDB)) ./... 2>&1); rc=$$?; \
	if echo "$$out" | grep -q 'fetching vulnerabilities' && \
	   echo "$$out" | grep -Eq 'no such host|connection refused|i/o timeout|network is unreachable'; then \
		echo "govulncheck: SKIPPED, the vulnerability database is unreachable from this machine: $$(echo "$$out" | head -1)"; \
		exit 0; \
	fi; \
	echo "$$out"; exit $$rc

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

#!/bin/sh
# govulncheck.sh GO: runs govulncheck (pinned as a tool in go.mod) over the
# module, against the first vulnerability database it can use:
#   1. GOVULNDB, when set (a URL, e.g. file:///path/to/a/copy);
#   2. vuln.go.dev, the live database;
#   3. when vuln.go.dev cannot be reached (no DNS, no route, refused), the
#      newest golang.org/x/vulndb module through the Go module proxy: the
#      repository vuln.go.dev is built from, whose data/osv holds the same
#      entries (govulncheck reads a directory of OSV files as a database);
#   4. when the proxy does not serve it either, the snapshot committed in
#      tools/vulndb (see its README), so that a machine without that
#      network still checks every dependency against what was known on the
#      snapshot's date.
# It says which database answered, with its date. Any finding in code we
# call fails, whichever database answered.
set -u
GO=${1:-go}
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.." || exit 1
# What govulncheck prints when the database's host cannot be reached.
unreachable='no such host|connection refused|i/o timeout|network is unreachable|403 Forbidden'

if [ -n "${GOVULNDB:-}" ]; then
	echo "govulncheck: database $GOVULNDB (GOVULNDB)"
	exec "$GO" tool govulncheck -db "$GOVULNDB" ./...
fi

out=$("$GO" tool govulncheck ./... 2>&1)
rc=$?
if ! { echo "$out" | grep -q 'fetching vulnerabilities' &&
	echo "$out" | grep -Eq "$unreachable"; }; then
	echo "govulncheck: database https://vuln.go.dev"
	echo "$out"
	exit $rc
fi

echo "govulncheck: vuln.go.dev is unreachable from this machine ($(echo "$out" | grep -Eo "$unreachable" | head -1));"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

# Downloaded from outside the module, so that nothing is added to go.mod.
dl=$(cd "$dir" && "$GO" mod download -json golang.org/x/vulndb@latest 2>/dev/null)
osv=$(echo "$dl" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')/data/osv
if [ -d "$osv" ]; then
	echo "govulncheck: using golang.org/x/vulndb $(echo "$dl" | sed -n 's/^[[:space:]]*"Version": "\(.*\)",$/\1/p') from the module proxy, $(ls "$osv" | grep -c '\.json$') entries"
	"$GO" tool govulncheck -db "file://$osv" ./...
	exit
fi

tar -xzf "$here/vulndb/go-vulndb.tar.gz" -C "$dir" || exit 1
echo "govulncheck: the module proxy does not serve golang.org/x/vulndb either;"
echo "govulncheck: using the committed snapshot: $(cat "$here/vulndb/VERSION") (refresh: make vulndb)"
"$GO" tool govulncheck -db "file://$dir" ./...

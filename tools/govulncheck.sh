#!/bin/sh
# govulncheck.sh GO: runs govulncheck (pinned as a tool in go.mod) over the
# module, against the first vulnerability database it can use:
#   1. GOVULNDB, when set (a URL, e.g. file:///path/to/a/copy);
#   2. vuln.go.dev, the live database;
#   3. when vuln.go.dev cannot be reached (no DNS, no route, refused), the
#      snapshot committed in tools/vulndb (see its README), so that a machine
#      without that network still checks every dependency against what was
#      known on the snapshot's date. The date is printed with the result.
# Any finding in code we call fails, whichever database answered.
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

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
tar -xzf "$here/vulndb/go-vulndb.tar.gz" -C "$dir" || exit 1
echo "govulncheck: vuln.go.dev is unreachable from this machine ($(echo "$out" | grep -Eo "$unreachable" | head -1));"
echo "govulncheck: using the committed snapshot: $(cat "$here/vulndb/VERSION") (refresh: make vulndb)"
"$GO" tool govulncheck -db "file://$dir" ./...

package engine

import (
	"regexp"
	"strings"
	"unicode/utf8"
)

// Secrets that can show up in error text from transports and drivers:
// credentials in URLs, key=value pairs, bearer tokens and HTTP auth headers.
var secretPatterns = []struct {
	re   *regexp.Regexp
	repl string
}{
	{regexp.MustCompile(`(?i)\b([a-z][a-z0-9+.-]*://)[^/\s:@]*:[^/\s@]*@`), "${1}[REDACTED]@"},
	{regexp.MustCompile(`(?i)\b(bearer|basic)\s+[a-z0-9._~+/=-]+`), "${1} [REDACTED]"},
	{regexp.MustCompile(`(?i)\b(password|passwd|pwd|secret|token|api[_-]?key|access[_-]?key|authorization|signature|x-outbox-signature)(\s*[=:]\s*)("[^"]*"|'[^']*'|[^\s,;&]+)`), "${1}${2}[REDACTED]"},
}

// sanitize strips secrets from error text and makes it storable (see
// storable) before it is stored in the archive or logged.
func sanitize(msg string, max int) string {
	for _, p := range secretPatterns {
		msg = p.re.ReplaceAllString(msg, p.repl)
	}
	return storable(msg, max)
}

// storable makes text from a rail safe to store in a PostgreSQL text column:
// valid UTF-8 without NUL bytes (which PostgreSQL rejects; one such outcome
// would fail its whole batch), truncated to max bytes on a rune boundary.
func storable(msg string, max int) string {
	msg = strings.ToValidUTF8(msg, "?")
	msg = strings.ReplaceAll(msg, "\x00", "?")
	if max > 0 && len(msg) > max {
		cut := max
		for cut > 0 && !utf8.RuneStart(msg[cut]) {
			cut--
		}
		msg = msg[:cut]
	}
	return msg
}

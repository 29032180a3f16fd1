package rails

import (
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/ledgerline/outbox/payment"
)

// CleanText makes text that comes from a rail (its reference, code and
// message, a transport's error) safe to store and to log: valid UTF-8
// (invalid bytes become U+FFFD), no NUL (PostgreSQL refuses it in text,
// and one such outcome would fail its whole batch), control and format
// characters replaced by a space (a rail must not be able to forge log
// lines or reverse what an operator reads), at most maxBytes bytes, cut on
// a rune boundary (0: no limit).
func CleanText(s string, maxBytes int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.Map(func(r rune) rune {
		if payment.ControlRune(r) {
			return ' '
		}
		return r
	}, s)
	if maxBytes > 0 && len(s) > maxBytes {
		cut := maxBytes
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut]
	}
	return s
}

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

// RedactSecrets strips what looks like a credential from error text
// before it is stored or logged: user:password@ in URLs, bearer and basic
// tokens, and values of password=, token=, api_key: and similar pairs.
func RedactSecrets(s string) string {
	for _, p := range secretPatterns {
		s = p.re.ReplaceAllString(s, p.repl)
	}
	return s
}

package rails

import (
	"strings"
	"testing"
)

func TestRedactSecrets(t *testing.T) {
	t.Parallel()
	cases := map[string]string{
		"dial postgres://app:hunter2@db:5432/x failed":   "dial postgres://[REDACTED]@db:5432/x failed",
		"Authorization: Bearer abc.def.ghi":              "Authorization: [REDACTED] [REDACTED]",
		`upstream said password="s3 cret" and token=abc`: `upstream said password=[REDACTED] and token=[REDACTED]`,
		"api_key: XYZ123; rest":                          "api_key: [REDACTED]; rest",
		"plain failure":                                  "plain failure",
	}
	for in, want := range cases {
		if got := RedactSecrets(in); got != want {
			t.Errorf("RedactSecrets(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestCleanText(t *testing.T) {
	t.Parallel()
	// PostgreSQL text cannot hold NUL; invalid UTF-8 is replaced; control
	// and format characters cannot forge or disguise log lines.
	if got := CleanText("ok\r\nFAKE LOG LINE\x00\xff\u202eabc\u0085", 0); got != "ok  FAKE LOG LINE \uFFFD abc " {
		t.Errorf("CleanText = %q", got)
	}
	if got := CleanText("héllo wörld", 2); got != "h" {
		t.Errorf("truncation split a rune: %q", got)
	}
	if got := CleanText(strings.Repeat("é", 600), 1000); got != strings.Repeat("é", 500) {
		t.Errorf("truncated to %d bytes, want 1000", len(got))
	}
}

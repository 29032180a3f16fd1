package payment

import (
	"testing"
	"unicode"
)

// TestControlRuneASCIIFastPath: the ASCII shortcut says what the Unicode
// tables say, for every ASCII rune, and the tables still decide above it.
func TestControlRuneASCIIFastPath(t *testing.T) {
	t.Parallel()
	for r := rune(0); r < 0x80; r++ {
		want := unicode.IsControl(r) || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp)
		if got := ControlRune(r); got != want {
			t.Errorf("ControlRune(%U) = %v, want %v", r, got, want)
		}
	}
	for _, r := range []rune{0x85, 0x9f, 0x200b, 0x202e, 0x2028, 0x2029, 0xfeff} {
		if !ControlRune(r) {
			t.Errorf("ControlRune(%U) = false, want true", r)
		}
	}
	for _, r := range []rune{'a', ' ', '~', 0xa0, 0xe9, 0x4e2d} {
		if ControlRune(r) {
			t.Errorf("ControlRune(%U) = true, want false", r)
		}
	}
}

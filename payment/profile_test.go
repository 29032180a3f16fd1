package payment

import (
	"errors"
	"testing"
	"unicode"
)

// TestControlRuneASCIIFastPath: the ASCII shortcut says what the Unicode
// tables say, for every ASCII rune, and the tables still decide above it.
func TestControlRuneASCIIFastPath(t *testing.T) {
	t.Parallel()
	for r := rune(0); r < 0x80; r++ {
		want := unicode.IsControl(r) || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp,
			unicode.Other_Default_Ignorable_Code_Point, unicode.Variation_Selector)
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

// TestValidateTextRefusesInvisibleRunes guards ValidateText's promise to
// refuse characters that make two different keys look equal: the
// default-ignorable code points outside Cf render as nothing too
// (combining grapheme joiner, Hangul fillers, Khmer inherent vowels,
// Mongolian and emoji variation selectors, the variation selectors
// supplement, a tag) and passed before.
func TestValidateTextRefusesInvisibleRunes(t *testing.T) {
	t.Parallel()
	for _, r := range []rune{0x034F, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x180B, 0x180F, 0x2065, 0x3164, 0xFE00, 0xFE0F,
		0xFFA0, 0xE0001, 0xE0041, 0xE0100, 0xE01EF, 0xE0FFF, 0x200B, 0x200D, 0x2060, 0xFEFF} {
		v := "key-1" + string(r)
		if err := ValidateText(FieldIdempotencyKey, v, 200); !errors.Is(err, ErrValidation) {
			t.Errorf("%U renders as nothing: %q = %v, want a validation error (it looks like %q)", r, v, err, "key-1")
		}
	}
	// Visible neighbours stay valid: Hangul letters, a Khmer letter, an
	// emoji without its selector, Mongolian text, CJK.
	for _, v := range []string{"\uac00\u1100", "\u1780", "\u2764", "\u1820\u1821", "\u4e2d", "caf\u00e9"} {
		if err := ValidateText(FieldIdempotencyKey, v, 200); err != nil {
			t.Errorf("%q: %v", v, err)
		}
	}
}

package admin

import (
	"bufio"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Role is what a credential may do.
type Role string

const (
	// RoleAuditor reads everything and changes nothing.
	RoleAuditor Role = "auditor"
	// RoleOperator also acts: replays and acknowledges dead letters, cancels
	// pending instructions, pauses and resumes rails.
	RoleOperator Role = "operator"
)

// Token is one credential: a name (recorded in the archive as who acted),
// a role, and the secret's SHA-256 (the secret itself is not kept).
type Token struct {
	Name string
	Role Role
	hash [sha256.Size]byte
}

// NewToken makes a credential from its secret.
func NewToken(name string, role Role, secret string) (Token, error) {
	switch {
	case name == "" || strings.ContainsAny(name, " \t\r\n"):
		return Token{}, fmt.Errorf("%w: a token's name must be one word", ErrTokens)
	case role != RoleAuditor && role != RoleOperator:
		return Token{}, fmt.Errorf("%w: token %s: role %q is neither auditor nor operator", ErrTokens, name, role)
	case len(secret) < 16:
		return Token{}, fmt.Errorf("%w: token %s: the secret must have at least 16 characters", ErrTokens, name)
	}
	return Token{Name: name, Role: role, hash: sha256.Sum256([]byte(secret))}, nil
}

// ErrTokens is returned for a malformed credentials file.
var ErrTokens = errors.New("admin tokens")

// ParseTokens reads credentials, one per line: ROLE NAME SECRET (role
// auditor or operator). Blank lines and lines starting with # are skipped.
// A name or a secret used twice is refused (see CheckTokens). Errors name
// the line and the tokens, never the secret.
func ParseTokens(r io.Reader) ([]Token, error) {
	var out []Token
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 3 {
			return nil, fmt.Errorf("%w: line %d: want ROLE NAME SECRET", ErrTokens, n)
		}
		t, err := NewToken(f[1], Role(f[0]), f[2])
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		out = append(out, t)
		if err := CheckTokens(out); err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTokens, err)
	}
	return out, nil
}

// CheckTokens refuses credentials that cannot be told apart: two tokens
// with one name (the archive could not say which acted) or with one secret
// (a request would get whichever matched, perhaps the operator's role
// under an auditor's name). Callers joining tokens from several sources
// check the joined list. The error names the tokens, never the secret.
func CheckTokens(tokens []Token) error {
	names := make(map[string]bool, len(tokens))
	secrets := make(map[[sha256.Size]byte]string, len(tokens))
	for _, t := range tokens {
		if names[t.Name] {
			return fmt.Errorf("%w: token %s is defined twice", ErrTokens, t.Name)
		}
		names[t.Name] = true
		if other, ok := secrets[t.hash]; ok {
			return fmt.Errorf("%w: tokens %s and %s share a secret; give each its own", ErrTokens, other, t.Name)
		}
		secrets[t.hash] = t.Name
	}
	return nil
}

// match returns the token whose secret is secret. Every token is compared,
// in constant time over fixed-length hashes, so neither the time taken nor
// the secret's length tells which token came close. A secret matching
// more than one token matches none: CheckTokens refuses such lists, and
// guessing between a weaker and a stronger role is worse than refusing.
func match(tokens []Token, secret string) (Token, bool) {
	h := sha256.Sum256([]byte(secret))
	var found Token
	matches := 0
	for _, t := range tokens {
		if subtle.ConstantTimeCompare(h[:], t.hash[:]) == 1 {
			found = t
			matches++
		}
	}
	return found, matches == 1
}

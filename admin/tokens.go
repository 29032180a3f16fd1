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
	// RoleOperator also replays and acknowledges dead letters.
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
// Errors name the line, never the secret.
func ParseTokens(r io.Reader) ([]Token, error) {
	var out []Token
	names := map[string]bool{}
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
		if names[t.Name] {
			return nil, fmt.Errorf("%w: line %d: token %s is defined twice", ErrTokens, n, t.Name)
		}
		names[t.Name] = true
		out = append(out, t)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrTokens, err)
	}
	return out, nil
}

// match returns the token whose secret is secret. Every token is compared,
// in constant time over fixed-length hashes, so neither the time taken nor
// the secret's length tells which token came close.
func match(tokens []Token, secret string) (Token, bool) {
	h := sha256.Sum256([]byte(secret))
	var found Token
	ok := 0
	for _, t := range tokens {
		if subtle.ConstantTimeCompare(h[:], t.hash[:]) == 1 {
			found, ok = t, 1
		}
	}
	return found, ok == 1
}

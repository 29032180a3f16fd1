package admin_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/admin"
)

// TestParseTokensRefusesASharedSecret: two tokens with one secret would
// make a request's name and role depend on which of them matched last (an
// auditor sharing an operator's secret acting as the operator, under the
// wrong name in the archive); the error names both tokens, not the secret.
func TestParseTokensRefusesASharedSecret(t *testing.T) {
	t.Parallel()
	_, err := admin.ParseTokens(strings.NewReader("operator oscar " + operatorSecret + "\n\nauditor audra " + operatorSecret + "\n"))
	if !errors.Is(err, admin.ErrTokens) {
		t.Fatalf("ParseTokens = %v, want ErrTokens", err)
	}
	for _, want := range []string{"line 3", "audra", "oscar"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error %q does not name %q", err, want)
		}
	}
	if strings.Contains(err.Error(), operatorSecret) {
		t.Errorf("the error %q names the secret", err)
	}
}

// TestCheckTokens: tokens from several sources (the relay's file and
// environment variable) are refused when two share a name or a secret.
func TestCheckTokens(t *testing.T) {
	t.Parallel()
	tok := func(name string, role admin.Role, secret string) admin.Token {
		t.Helper()
		k, err := admin.NewToken(name, role, secret)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	audra, oscar := tok("audra", admin.RoleAuditor, auditorSecret), tok("oscar", admin.RoleOperator, operatorSecret)
	if err := admin.CheckTokens([]admin.Token{audra, oscar}); err != nil {
		t.Errorf("distinct tokens: %v", err)
	}
	for _, c := range []struct {
		name   string
		tokens []admin.Token
		want   string
	}{
		{"shared name", []admin.Token{audra, oscar, tok("audra", admin.RoleAuditor, "another-secret-0123456789")}, "token audra is defined twice"},
		{"shared secret", []admin.Token{oscar, audra, tok("eve", admin.RoleAuditor, operatorSecret)}, "tokens oscar and eve share a secret"},
	} {
		err := admin.CheckTokens(c.tokens)
		if !errors.Is(err, admin.ErrTokens) || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), operatorSecret) {
			t.Errorf("%s: %v, want ErrTokens with %q (and no secret)", c.name, err, c.want)
		}
	}
	// Tokens given to New directly are checked too: the API would
	// otherwise pick one of two tokens sharing a secret.
	pool, err := pgxpool.New(t.Context(), "postgres://nobody@127.0.0.1:1/nowhere") // connects lazily: never here
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := admin.New(admin.Config{Pool: pool, Tokens: []admin.Token{oscar, tok("eve", admin.RoleAuditor, operatorSecret)}}); !errors.Is(err, admin.ErrInvalidConfig) {
		t.Errorf("New with two tokens sharing a secret: %v, want ErrInvalidConfig", err)
	}
}

// TestNewRefusesNegativeThresholds: a negative DegradedAfter or
// HorizonDegradedAfter (`outbox relay --degraded-after -5m`, a flipped
// sign) is refused with ErrInvalidConfig; it used to become the default
// (a minute, five) without a word, so /readyz said degraded at a
// threshold nobody asked for.
func TestNewRefusesNegativeThresholds(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(t.Context(), "postgres://nobody@127.0.0.1:1/nowhere") // connects lazily: never here
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, cfg := range []admin.Config{{Pool: pool, DegradedAfter: -5 * time.Minute}, {Pool: pool, HorizonDegradedAfter: -time.Second}} {
		if _, err := admin.New(cfg); !errors.Is(err, admin.ErrInvalidConfig) {
			t.Errorf("New with DegradedAfter %v, HorizonDegradedAfter %v: %v, want ErrInvalidConfig", cfg.DegradedAfter, cfg.HorizonDegradedAfter, err)
		}
	}
	if _, err := admin.New(admin.Config{Pool: pool}); err != nil {
		t.Errorf("New with the default thresholds: %v", err)
	}
}

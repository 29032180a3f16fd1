package admin_test

import (
	"errors"
	"fmt"
	"strings"

	"github.com/ledgerline/outbox/admin"
)

// A tokens file holds one credential per line, ROLE NAME SECRET. The name is
// what the archive records as who acted, so two tokens may share neither a
// name nor a secret; the error names the tokens, never the secret.
func ExampleParseTokens() {
	tokens, err := admin.ParseTokens(strings.NewReader(`
# role     name   secret (16+ characters)
auditor    alice  correct-horse-battery-staple
operator   bob    tr0ub4dor-and-3-more
`))
	fmt.Println(err)
	for _, t := range tokens {
		fmt.Println(t.Role, t.Name)
	}

	_, err = admin.ParseTokens(strings.NewReader(`
auditor    alice  correct-horse-battery-staple
operator   carol  correct-horse-battery-staple
`))
	fmt.Println(errors.Is(err, admin.ErrTokens), err)
	// Output:
	// <nil>
	// auditor alice
	// operator bob
	// true line 3: admin tokens: tokens alice and carol share a secret; give each its own
}

package pending_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestProducerLinksLittle: a program that imports pending to enqueue links
// pgx, uuid, the validators and nothing heavier: no migration tool, no
// template library, no circuit breaker, no HTTP client. The test fails
// when the dependency set grows past this list; grow it only on purpose.
func TestProducerLinksLittle(t *testing.T) {
	t.Parallel()
	allowedModules := []string{
		"github.com/ledgerline/outbox",
		"github.com/jackc/pgx/v5", "github.com/jackc/pgpassfile", "github.com/jackc/pgservicefile", // the driver
		"golang.org/x/text",          // pgx: SASL (SCRAM) password normalisation
		"github.com/gofrs/uuid/v5",   // outbox ids
		"github.com/bojanz/currency", // ISO 4217 codes and minor units
		"github.com/cockroachdb/apd/v3",
		"github.com/jacoelho/banking",        // IBAN and BIC checks
		"github.com/go-json-experiment/json", // strict metadata checks (encoding/json/v2)
	}
	forbiddenStd := []string{"net/http", "text/template", "html/template"}

	// go test puts its own go first on PATH.
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(goTool, "list", "-deps", "-f",
		"{{if .Standard}}std {{.ImportPath}}{{else}}mod {{with .Module}}{{.Path}}{{end}}{{end}}",
		"github.com/ledgerline/outbox/pending").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	modules := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		kind, path, _ := strings.Cut(line, " ")
		switch {
		case kind == "std" && slices.Contains(forbiddenStd, path):
			t.Errorf("pending links %s", path)
		case kind == "mod":
			modules[path] = true
		}
	}
	for m := range modules {
		if !slices.Contains(allowedModules, m) {
			t.Errorf("pending links module %s, which is not on the allowed list", m)
		}
	}
	t.Logf("pending links %d modules", len(modules))
}

package rails

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestSecretSourcesAgree: one secret signs the same whether it comes from
// a file or a variable. secret_env kept the trailing newline that
// secret_file trimmed (a variable set with `$(cat key; echo)` or from a
// Kubernetes secret created from a file), so the relayer signed with
// other bytes than the receiver and every request was answered 401. A
// secret that is empty after trimming, or that begins or ends with other
// whitespace (which one side may trim and the other not), is refused with
// ErrSecretInvalid, naming the source but never the value.
func TestSecretSourcesAgree(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	load := func(src, value string) ([]byte, error) {
		if src == "env" {
			return SecretSource{Env: "PSP_SECRET", Getenv: func(k string) string {
				if k == "PSP_SECRET" {
					return value
				}
				return ""
			}}.Load()
		}
		p := filepath.Join(dir, "key")
		if err := os.WriteFile(p, []byte(value), 0o600); err != nil {
			t.Fatal(err)
		}
		return SecretSource{File: p}.Load()
	}
	secret := string(testWebhookSecret)
	for _, src := range []string{"file", "env"} {
		for _, v := range []string{secret, secret + "\n", secret + "\r\n", secret + "\n\n"} {
			got, err := load(src, v)
			if err != nil || !bytes.Equal(got, testWebhookSecret) {
				t.Errorf("%s %q: %q, %v; want the secret without its line ending", src, v, got, err)
			}
		}
		for _, v := range []string{"\n", "\r\n", " ", " \n", "\t" + secret, " " + secret, secret + " ", secret + "\t\n", "\n" + secret} {
			got, err := load(src, v)
			if !errors.Is(err, ErrSecretInvalid) {
				t.Errorf("%s %q: %q, %v; want ErrSecretInvalid", src, v, got, err)
				continue
			}
			assertNoSecret(t, src+" error", err.Error())
		}
	}
}

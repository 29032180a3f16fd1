package rails

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestSecretTrimsOneLineEndingOnly: the editor's newline ("\n", or
// "\r\n") is trimmed once; any other CR or LF at the end belongs to the
// secret, which then ends with whitespace and is refused. Every trailing
// CR and LF was trimmed: a raw secret ending in "\r", or in "\n" before
// the editor's newline, signed with bytes the receiver did not have, and
// every request was answered 401, with nothing said at start-up.
func TestSecretTrimsOneLineEndingOnly(t *testing.T) {
	t.Parallel()
	p := filepath.Join(t.TempDir(), "key")
	secret := string(testWebhookSecret)
	for _, v := range []string{secret + "\r", secret + "\n\n", secret + "\r\n\n", secret + "\r\r\n", secret + "\n\r", secret + "\n\r\n"} {
		if err := os.WriteFile(p, []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
		if got, err := (SecretSource{File: p}).Load(); !errors.Is(err, ErrSecretInvalid) {
			t.Errorf("%q: loaded as %q (%v); want ErrSecretInvalid: the bytes before the editor's newline end with a line ending of the secret's own", v, got, err)
		}
	}
}

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
		for _, v := range []string{secret, secret + "\n", secret + "\r\n"} {
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

package rails

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// writeSecretFile replaces path's content the way a Kubernetes secret
// volume does: a new file renamed over the old one, never a file written
// in place.
func writeSecretFile(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(tmp, mode); err != nil { // WriteFile's mode is masked by the umask
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// signedWith is a receiver that answers 200 to a request signed with the
// secret it holds now and 401 to any other, and counts both.
type signedWith struct {
	secret      atomic.Pointer[[]byte]
	ok, refused atomic.Int64
}

func (s *signedWith) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if VerifySignature(*s.secret.Load(), r.Header, body, time.Now(), 0) != nil {
		s.refused.Add(1)
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	s.ok.Add(1)
}

// rotatingRail builds, through Config.Build, one webhook rail whose secret
// is the file it returns (holding first), pointed at rcv.
func rotatingRail(t *testing.T, rcv http.Handler, first string) (*Set, string) {
	t.Helper()
	srv := httptest.NewServer(rcv)
	t.Cleanup(srv.Close)
	file := filepath.Join(t.TempDir(), "psp.key")
	writeSecretFile(t, file, first, 0o600)
	cfg := &Config{
		Transports: map[string]TransportConfig{"psp": {Kind: TransportKindWebhook, Webhook: &WebhookConfig{URL: srv.URL, SecretFile: file}}},
		Rails:      []RailConfig{{Type: "ach", Profile: "generic", Transport: "psp"}},
	}
	built, err := cfg.Build(BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, rs := range built.Set.rotating() {
		rs.settle = 20 * time.Millisecond // the default second only slows the test
	}
	return built.Set, file
}

// send dispatches one instruction through set and returns its decision.
func send(t *testing.T, set *Set, key string) Decision {
	t.Helper()
	ins := testInstruction(t, key)
	ins.RailType = "ach"
	return set.Execute(context.Background(), ins)
}

// TestWebhookSecretFileRotatesWithoutRestart: a webhook rail whose secret
// is a file signs, after Set.ReloadSecrets, with the secret the file holds
// now. Before, the secret was read once when the rails were built, and a
// rotated secret needed a restart of every relayer.
func TestWebhookSecretFileRotatesWithoutRestart(t *testing.T) {
	t.Parallel()
	rcv := &signedWith{}
	old, next := []byte("secret-A-0123456789abcdef0123456789"), []byte("secret-B-0123456789abcdef0123456789")
	rcv.secret.Store(&old)
	set, file := rotatingRail(t, rcv, string(old)+"\n")
	if d := send(t, set, "k-1"); d.Outcome != Dispatched {
		t.Fatalf("before the rotation: %+v", d)
	}
	// An unchanged file changes nothing.
	if got := set.ReloadSecrets(); len(got) != 1 || got[0].Changed || got[0].Err != nil {
		t.Fatalf("reload of an unchanged file: %+v", got)
	}
	writeSecretFile(t, file, string(next)+"\n", 0o600)
	rcv.secret.Store(&next)
	got := set.ReloadSecrets()
	if len(got) != 1 || !got[0].Changed || got[0].Err != nil || len(got[0].Rails) != 1 || got[0].Rails[0] != "ach" {
		t.Fatalf("reload of a rotated file: %+v", got)
	}
	if d := send(t, set, "k-2"); d.Outcome != Dispatched {
		t.Fatalf("after the rotation: %+v (the receiver refused %d requests)", d, rcv.refused.Load())
	}
	st, ok := set.SecretStatus("ach")
	if !ok || st.Rotations != 1 || st.Err != nil || st.Source != file {
		t.Fatalf("status %+v, %v", st, ok)
	}
}

// TestSecretRotationKeepsTheSecretInForceOnARefusedFile: a secret file
// rotated into one the start would refuse (readable by others, empty,
// surrounded by whitespace) is refused with the same typed error, the
// rail goes on signing with the secret in force, and the status says so
// until the file is fixed.
func TestSecretRotationKeepsTheSecretInForceOnARefusedFile(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, content string
		mode          os.FileMode
		want          error
	}{
		{"readable by others", "secret-B-0123456789abcdef0123456789", 0o644, ErrSecretExposed},
		{"empty", "\n", 0o600, ErrSecretInvalid},
		{"surrounded by whitespace", " secret-B-0123456789abcdef0123456789\n", 0o600, ErrSecretInvalid},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			rcv := &signedWith{}
			old := []byte("secret-A-0123456789abcdef0123456789")
			rcv.secret.Store(&old)
			set, file := rotatingRail(t, rcv, string(old))
			writeSecretFile(t, file, c.content, c.mode)
			got := set.ReloadSecrets()
			if len(got) != 1 || got[0].Changed || !errors.Is(got[0].Err, c.want) {
				t.Fatalf("reload: %+v, want %v", got, c.want)
			}
			st, _ := set.SecretStatus("ach")
			if !errors.Is(st.Err, c.want) || st.Failures != 1 || st.Rotations != 0 {
				t.Fatalf("status %+v", st)
			}
			if d := send(t, set, "k-1"); d.Outcome != Dispatched {
				t.Fatalf("with a refused file the secret in force must sign: %+v", d)
			}
			next := []byte("secret-C-0123456789abcdef0123456789")
			writeSecretFile(t, file, string(next), 0o600)
			rcv.secret.Store(&next)
			if got := set.ReloadSecrets(); len(got) != 1 || !got[0].Changed || got[0].Err != nil {
				t.Fatalf("reload of the fixed file: %+v", got)
			}
			if st, _ := set.SecretStatus("ach"); st.Err != nil || st.Rotations != 1 {
				t.Fatalf("status after the fix %+v", st)
			}
			if d := send(t, set, "k-2"); d.Outcome != Dispatched {
				t.Fatalf("after the fix: %+v", d)
			}
		})
	}
}

// TestSecretRotationWaitsForAFileBeingWritten: a file that changes between
// the two reads of a reload (a writer still writing it in place) is not
// adopted, nor reported as refused; the secret in force signs on, and the
// next reload adopts the file once it reads the same twice.
func TestSecretRotationWaitsForAFileBeingWritten(t *testing.T) {
	t.Parallel()
	rcv := &signedWith{}
	old, next := []byte("secret-A-0123456789abcdef0123456789"), []byte("secret-B-0123456789abcdef0123456789")
	rcv.secret.Store(&old)
	set, file := rotatingRail(t, rcv, string(old))
	rs := set.rotating()[0]
	// The first read sees half of the new secret; the writer finishes
	// before the second.
	if err := os.WriteFile(file, next[:10], 0o600); err != nil {
		t.Fatal(err)
	}
	rs.betweenReads = func() {
		if err := os.WriteFile(file, next, 0o600); err != nil {
			t.Error(err)
		}
	}
	got := set.ReloadSecrets()
	if len(got) != 1 || got[0].Changed || !errors.Is(got[0].Err, ErrSecretChanging) {
		t.Fatalf("reload of a file being written: %+v", got)
	}
	if st, _ := set.SecretStatus("ach"); st.Err != nil || st.Failures != 0 {
		t.Fatalf("a file being written is no refused file: %+v", st)
	}
	if d := send(t, set, "k-1"); d.Outcome != Dispatched {
		t.Fatalf("the secret in force must sign while the file is written: %+v", d)
	}
	rs.betweenReads = nil
	rcv.secret.Store(&next)
	if got := set.ReloadSecrets(); len(got) != 1 || !got[0].Changed || got[0].Err != nil {
		t.Fatalf("reload of the finished file: %+v", got)
	}
	if d := send(t, set, "k-2"); d.Outcome != Dispatched {
		t.Fatalf("after the rotation: %+v", d)
	}
}

// TestSandboxAcceptsThePreviousSecretDuringARotation: the sandbox rail's
// server, its secret a rotating file, accepts requests signed with the
// previous secret for the window it was given after the file changed, and with the
// new one from then on; after the window only the new one.
func TestSandboxAcceptsThePreviousSecretDuringARotation(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "sandbox.key")
	old, next := "secret-A-0123456789abcdef0123456789", "secret-B-0123456789abcdef0123456789"
	writeSecretFile(t, file, old, 0o600)
	const window = 3 * time.Second // long enough for two requests on a loaded machine
	rs, err := NewRotatingSecret(SecretSource{File: file}, window)
	if err != nil {
		t.Fatal(err)
	}
	rs.settle = 0
	srv := httptest.NewServer(NewSandboxHandlerSecret(NewSandbox(SandboxOptions{}), rs, 0))
	t.Cleanup(srv.Close)
	hook := func(secret string) *Webhook {
		w, err := NewWebhook(WebhookOptions{URL: srv.URL, Secret: []byte(secret)})
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	signedOld, signedNext := hook(old), hook(next)
	status := func(w *Webhook, key string) string {
		res, err := w.Send(context.Background(), testInstruction(t, key))
		if err != nil {
			t.Fatal(err)
		}
		return res.Code
	}
	if got := status(signedOld, "k-1"); got != "HTTP_200" {
		t.Fatalf("old secret before the rotation: %s", got)
	}
	if got := status(signedNext, "k-2"); got != "HTTP_401" {
		t.Fatalf("new secret before the rotation: %s", got)
	}
	writeSecretFile(t, file, next, 0o600)
	rotated := time.Now()
	if changed, err := rs.Reload(); !changed || err != nil {
		t.Fatalf("reload: %v, %v", changed, err)
	}
	if got := status(signedNext, "k-3"); got != "HTTP_200" {
		t.Fatalf("new secret after the rotation: %s", got)
	}
	if got := status(signedOld, "k-4"); got != "HTTP_200" {
		t.Fatalf("old secret within the window: %s", got)
	}
	time.Sleep(time.Until(rotated.Add(window + 100*time.Millisecond)))
	if got := status(signedOld, "k-5"); got != "HTTP_401" {
		t.Fatalf("old secret after the window: %s", got)
	}
	if got := status(signedNext, "k-6"); got != "HTTP_200" {
		t.Fatalf("new secret after the window: %s", got)
	}
}

package rails

import (
	"bytes"
	"errors"
	"fmt"
	"os"
)

// ErrSecretExposed is wrapped by the error of [SecretSource.Load] for a
// secret file that other users of the machine can read, or that anyone but
// its owner can write: whoever reads the secret can sign payments.
var ErrSecretExposed = errors.New("webhook secret file is exposed to other users")

// ErrSecretInvalid is wrapped by the error of [SecretSource.Load] for a
// secret that is unset, empty once its line ending is trimmed, or that
// begins or ends with whitespace.
var ErrSecretInvalid = errors.New("webhook secret is unusable")

// SecretSource says where a webhook secret is read from: a file or, when
// File is empty, the environment variable named Env. The file wins when
// both are given.
//
// Both sources follow one rule, so a secret signs the same wherever it is
// kept: one trailing line ending ("\n" or "\r\n") is trimmed, as editors,
// `echo` and secrets created from files add it; a secret that is then
// empty, or that begins or ends with whitespace (a second line ending, a
// lone "\r" included), is refused with [ErrSecretInvalid] rather than
// trimmed, because whether the receiver trims it too cannot be known, and
// a guess signs with other bytes. So a raw secret whose last byte is a
// line feed cannot be kept as it is: keep binary secrets encoded.
type SecretSource struct {
	File string
	Env  string
	// AllowWorldReadable accepts a file that users other than its owner and
	// group can read (or that its group or others can write). Off by
	// default: such a file is refused with [ErrSecretExposed], naming the
	// fix (chmod 600, or 640 for a group such as a Kubernetes fsGroup).
	AllowWorldReadable bool
	// Getenv reads Env; nil means os.Getenv.
	Getenv func(string) string
}

// Load reads the secret. It fails when neither a file nor a variable is
// given or the secret found is empty; errors name the file or variable,
// never the secret.
func (s SecretSource) Load() ([]byte, error) {
	switch {
	case s.File != "":
		if !s.AllowWorldReadable {
			if err := checkSecretFileMode(s.File); err != nil {
				return nil, err
			}
		}
		b, err := os.ReadFile(s.File)
		if err != nil {
			return nil, fmt.Errorf("rails: reading webhook secret: %w", err)
		}
		return checkSecret(b, fmt.Sprintf("file %q", s.File))
	case s.Env != "":
		getenv := s.Getenv
		if getenv == nil {
			getenv = os.Getenv
		}
		return checkSecret([]byte(getenv(s.Env)), "variable "+s.Env)
	}
	return nil, errors.New("rails: no webhook secret configured: give a secret file or an environment variable")
}

// checkSecret applies the rule of [SecretSource] to a secret read from
// where (which errors name; the value never appears in them).
func checkSecret(b []byte, where string) ([]byte, error) {
	// One line ending, the editor's (or echo's), and no more: a CR or LF
	// before it is the secret's own, and, left on, makes it end with
	// whitespace, refused below. Trimming every one signed a raw secret
	// that ended so with other bytes than the receiver's.
	if c, ok := bytes.CutSuffix(b, []byte("\r\n")); ok {
		b = c
	} else {
		b = bytes.TrimSuffix(b, []byte("\n"))
	}
	switch {
	case len(b) == 0:
		return nil, fmt.Errorf("rails: %w: %s is unset or empty", ErrSecretInvalid, where)
	case isSpaceByte(b[0]) || isSpaceByte(b[len(b)-1]):
		return nil, fmt.Errorf("rails: %w: %s begins or ends with whitespace (only a trailing line ending is trimmed)", ErrSecretInvalid, where)
	}
	return b, nil
}

// isSpaceByte reports whether c is ASCII whitespace.
func isSpaceByte(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'
}

// checkSecretFileMode refuses a secret file (after symlinks: Kubernetes
// mounts secrets through them) whose permission bits let others read it or
// anyone but the owner write it.
func checkSecretFileMode(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("rails: reading webhook secret: %w", err)
	}
	if perm := fi.Mode().Perm(); perm&0o026 != 0 {
		return fmt.Errorf("rails: %w: %q has mode %04o; make it readable by its owner only (chmod 600; 640 for a group) or allow it explicitly",
			ErrSecretExposed, path, perm)
	}
	return nil
}

// LoadSecret reads a webhook secret from file or, when file is empty, from
// the environment variable envVar; see [SecretSource.Load] (a file other
// users can read is refused).
func LoadSecret(file, envVar string) ([]byte, error) {
	return SecretSource{File: file, Env: envVar}.Load()
}

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

// SecretSource says where a webhook secret is read from: a file (trailing
// newlines trimmed, as editors and `echo` add them) or, when File is empty,
// the environment variable named Env. The file wins when both are given.
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
		b = bytes.TrimRight(b, "\r\n")
		if len(b) == 0 {
			return nil, fmt.Errorf("rails: webhook secret file %q is empty", s.File)
		}
		return b, nil
	case s.Env != "":
		getenv := s.Getenv
		if getenv == nil {
			getenv = os.Getenv
		}
		v := getenv(s.Env)
		if v == "" {
			return nil, fmt.Errorf("rails: webhook secret variable %s is unset or empty", s.Env)
		}
		return []byte(v), nil
	}
	return nil, errors.New("rails: no webhook secret configured: give a secret file or an environment variable")
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

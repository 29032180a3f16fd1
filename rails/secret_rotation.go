package rails

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// ErrSecretChanging is the error of [RotatingSecret.Reload] when the
// secret's file read otherwise on a second read than on the first: a
// writer is still writing it. Nothing is adopted and nothing is reported
// as refused; the next reload reads it again.
var ErrSecretChanging = errors.New("webhook secret file changed while it was read (still being written); the secret in force is kept")

// DefaultSecretSettle is how long [RotatingSecret.Reload] waits between
// its two reads of a secret that changed: a file written in place (not
// renamed over the old one, as Kubernetes and `mv` do) is adopted only
// once two reads this far apart agree, so a request is never signed with
// half a secret.
const DefaultSecretSettle = time.Second

// RotatingSecret is a webhook secret that can be read again while the
// process runs, so that a secret rotated in its file (a Kubernetes secret
// volume swaps it through a symlink) takes effect without a restart. A
// reload applies the checks of [SecretSource.Load] (mode, empty,
// whitespace); a secret they refuse is reported (Reload's error,
// [RotatingSecret.Status]) and the secret in force is kept, so a bad
// rotation never stops signing. It is safe for concurrent use.
//
// The receiving side (the sandbox rail's server) keeps accepting the
// previous secret for a while after a change (keepPrevious), so that
// senders that have not reloaded yet are not refused meanwhile.
type RotatingSecret struct {
	src          SecretSource
	keepPrevious time.Duration
	// settle is the wait between the two reads of a changed secret
	// (DefaultSecretSettle; tests shorten it).
	settle time.Duration
	// betweenReads, if set, runs between the two reads (tests).
	betweenReads func()

	keys atomic.Pointer[secretKeys]
	// reload serializes Reload; statusMu guards status.
	reload   sync.Mutex
	statusMu sync.Mutex
	status   SecretStatus
}

// secretKeys is the secret in force and the one it replaced, never
// modified once stored (a request being signed may still hold them).
type secretKeys struct {
	current       []byte
	previous      []byte
	previousUntil time.Time
}

// SecretStatus is what [RotatingSecret.Status] reports.
type SecretStatus struct {
	// Source names where the secret is read from: the file's path, or
	// "variable NAME".
	Source string
	// LoadedAt is when the secret in force was read.
	LoadedAt time.Time
	// Rotations counts the secrets adopted since the first.
	Rotations int64
	// Failures counts reloads that found a secret the checks refuse.
	Failures int64
	// Err is the last reload's refusal while the file still holds a
	// refused secret (nil once a reload finds the secret in force or
	// adopts a new one): the secret in force is older than the file.
	Err error
}

// NewRotatingSecret reads the secret from src (see [SecretSource.Load]).
// keepPrevious is how long [RotatingSecret.Accepted] still lists a
// secret after a reload replaced it (zero: not at all, as a sender
// needs).
func NewRotatingSecret(src SecretSource, keepPrevious time.Duration) (*RotatingSecret, error) {
	b, err := src.Load()
	if err != nil {
		return nil, err
	}
	r := &RotatingSecret{src: src, keepPrevious: keepPrevious, settle: DefaultSecretSettle}
	r.keys.Store(&secretKeys{current: b})
	r.status = SecretStatus{Source: src.where(), LoadedAt: time.Now()}
	return r, nil
}

// where names the source for status and errors (never the value).
func (s SecretSource) where() string {
	if s.File != "" {
		return s.File
	}
	return "variable " + s.Env
}

// Key returns the secret in force. The slice must not be modified.
func (r *RotatingSecret) Key() []byte { return r.keys.Load().current }

// Accepted returns the secrets a receiver accepts at now: the one in
// force, and the one it replaced while within keepPrevious of the change.
func (r *RotatingSecret) Accepted(now time.Time) [][]byte {
	k := r.keys.Load()
	if k.previous != nil && now.Before(k.previousUntil) {
		return [][]byte{k.current, k.previous}
	}
	return [][]byte{k.current}
}

// Status reports the secret's source, when the secret in force was read,
// and the last reload's refusal, if the file still holds one.
func (r *RotatingSecret) Status() SecretStatus {
	r.statusMu.Lock()
	defer r.statusMu.Unlock()
	return r.status
}

// Reload reads the secret again and adopts it if it changed and passes
// the checks of [SecretSource.Load]; changed says whether it did. A
// refused secret is returned as the error (wrapping [ErrSecretExposed],
// [ErrSecretInvalid] or the read's error) and kept in Status until a
// reload finds a good one; the secret in force stays. A secret that
// differs from the one in force is read a second time, DefaultSecretSettle
// later, and adopted (or refused) only if both reads agree: otherwise
// the error is [ErrSecretChanging] and nothing changes.
func (r *RotatingSecret) Reload() (changed bool, err error) {
	r.reload.Lock()
	defer r.reload.Unlock()
	cur := r.keys.Load()
	first, err1 := r.src.Load()
	if err1 == nil && bytes.Equal(first, cur.current) {
		r.setStatus(func(s *SecretStatus) { s.Err = nil })
		return false, nil
	}
	if r.betweenReads != nil {
		r.betweenReads()
	}
	time.Sleep(r.settle)
	second, err2 := r.src.Load()
	switch {
	case (err1 == nil) != (err2 == nil), err1 == nil && !bytes.Equal(first, second):
		return false, fmt.Errorf("rails: %s: %w", r.src.where(), ErrSecretChanging)
	case err2 != nil:
		r.setStatus(func(s *SecretStatus) { s.Err, s.Failures = err2, s.Failures+1 })
		return false, err2
	case bytes.Equal(second, cur.current):
		// Changed and changed back within the settle time.
		r.setStatus(func(s *SecretStatus) { s.Err = nil })
		return false, nil
	}
	now := time.Now()
	r.keys.Store(&secretKeys{current: second, previous: cur.current, previousUntil: now.Add(r.keepPrevious)})
	r.setStatus(func(s *SecretStatus) { s.Err, s.LoadedAt, s.Rotations = nil, now, s.Rotations+1 })
	return true, nil
}

func (r *RotatingSecret) setStatus(f func(*SecretStatus)) {
	r.statusMu.Lock()
	defer r.statusMu.Unlock()
	f(&r.status)
}

// SecretReload is one secret's result of [Set.ReloadSecrets].
type SecretReload struct {
	// Rails are the rail types whose transport signs with the secret.
	Rails []string
	// Source names the secret's file.
	Source string
	// Changed says whether a new secret was adopted.
	Changed bool
	// Err is the reload's error (see [RotatingSecret.Reload]); the
	// secret in force is kept.
	Err error
}

// secretHolder is implemented by transports that sign with a
// [RotatingSecret] (a webhook whose secret is a file).
type secretHolder interface {
	RotatingSecret() *RotatingSecret
}

// rotating returns the rotating secrets of the set's transports, each
// once, in the order of the rail types that use them.
func (s *Set) rotating() []*RotatingSecret {
	var out []*RotatingSecret
	seen := make(map[*RotatingSecret]bool)
	for _, t := range s.types {
		if rs := s.secretOf(t); rs != nil && !seen[rs] {
			seen[rs] = true
			out = append(out, rs)
		}
	}
	return out
}

// secretOf returns the rotating secret a rail's transport signs with, or
// nil.
func (s *Set) secretOf(railType string) *RotatingSecret {
	r, ok := s.rails[railType]
	if !ok {
		return nil
	}
	if h, ok := r.opts.Transport.(secretHolder); ok {
		return h.RotatingSecret()
	}
	return nil
}

// ReloadSecrets reloads the secret of every transport that signs with a
// secret file ([RotatingSecret.Reload]), each once however many rails
// use it, and reports each one's result. A relayer calls it periodically
// and on SIGHUP (`outbox relay --secret-check-interval`).
func (s *Set) ReloadSecrets() []SecretReload {
	var out []SecretReload
	for _, rs := range s.rotating() {
		var types []string
		for _, t := range s.types {
			if s.secretOf(t) == rs {
				types = append(types, t)
			}
		}
		changed, err := rs.Reload()
		out = append(out, SecretReload{Rails: types, Source: rs.src.where(), Changed: changed, Err: err})
	}
	return out
}

// SecretStatus returns the status of the rotating secret a rail's
// transport signs with; false when it has none (a secret from a variable,
// which cannot change in a running process, or no webhook).
func (s *Set) SecretStatus(railType string) (SecretStatus, bool) {
	if rs := s.secretOf(railType); rs != nil {
		return rs.Status(), true
	}
	return SecretStatus{}, false
}

package pglocal

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
)

// account is the OS user the server binaries run as when we are root.
type account struct {
	name     string
	cred     *syscall.Credential
	gids     []uint32
	homeDir  string
	uid, gid uint32
}

// The methods of *account accept a nil receiver, meaning "not root: the
// server runs as ourselves", for which there is nothing to chown or check.

// serverAccount returns the OS user to run the server binaries as: nil
// (ourselves) unless we are root, because initdb and postgres refuse root.
func serverAccount() (*account, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pglocal: running as root, but PostgreSQL refuses to run as root and there is no \"postgres\" OS user to run it as (`apt-get install -y postgresql` creates one): %w", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("pglocal: OS user postgres: %w", err)
	}
	a := &account{name: u.Username, uid: uint32(uid), gid: uint32(gid), homeDir: u.HomeDir}
	groups, _ := u.GroupIds() // best effort: without them the server just has fewer rights
	for _, g := range groups {
		if n, err := strconv.ParseUint(g, 10, 32); err == nil && uint32(n) != a.gid {
			a.gids = append(a.gids, uint32(n))
		}
	}
	// Setting Groups explicitly also drops root's supplementary groups, so
	// the child has exactly the rights checkReachable assumes.
	a.cred = &syscall.Credential{Uid: a.uid, Gid: a.gid, Groups: a.gids}
	return a, nil
}

// makeScratch creates this process's /tmp/outbox-pg/<pid>-<random> and
// hands it to the server user, who creates the data dir and sockets in it.
func (a *account) makeScratch() (string, error) {
	if err := os.MkdirAll(ephemeralBase, 0o755); err != nil {
		return "", fmt.Errorf("pglocal: %w", err)
	}
	// Under root the base stays 0755 and root's, so nobody can plant entries
	// for root's CleanupStale to act on. Without root it is shared like /tmp
	// (world-writable, sticky) so that several users can run tests.
	mode := fs.FileMode(0o755)
	if a == nil {
		mode = 0o777 | fs.ModeSticky
	}
	if fi, err := os.Stat(ephemeralBase); err == nil && owner(fi) == uint32(os.Geteuid()) &&
		fi.Mode()&(fs.ModePerm|fs.ModeSticky) != mode {
		if err := os.Chmod(ephemeralBase, mode); err != nil {
			return "", fmt.Errorf("pglocal: %w", err)
		}
	}
	dir, err := os.MkdirTemp(ephemeralBase, strconv.Itoa(os.Getpid())+"-")
	if err != nil {
		return "", fmt.Errorf("pglocal: create ephemeral cluster dir: %w", err)
	}
	return dir, a.chown(dir)
}

// prepareDataDir creates dir and hands it to the server user. An
// initialized data dir must already be the server user's: postgres refuses
// any other owner, and chowning a whole cluster is not a decision to take
// behind the user's back.
func (a *account) prepareDataDir(dir string) error {
	// Parents we create must be traversable by the server user; MkdirAll
	// would give them the data dir's 0700.
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return fmt.Errorf("pglocal: create data dir: %w", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("pglocal: create data dir: %w", err)
	}
	if a == nil {
		return nil
	}
	if err := a.checkReachable(dir); err != nil {
		return err
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("pglocal: %w", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "PG_VERSION")); err == nil {
		if owner(fi) != a.uid {
			return fmt.Errorf("pglocal: data dir %s is owned by uid %d, but the server runs as OS user %s (uid %d); chown -R it", dir, owner(fi), a.name, a.uid)
		}
		return nil
	}
	return a.chown(dir)
}

// prepareSocketDir creates dir for the server user, or checks that it can
// create sockets there if dir already exists (it may be shared, like /tmp,
// so we must not chown it).
func (a *account) prepareSocketDir(dir string) error {
	_, statErr := os.Stat(dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("pglocal: create socket dir: %w", err)
	}
	if a == nil {
		return nil
	}
	if errors.Is(statErr, fs.ErrNotExist) {
		if err := a.chown(dir); err != nil {
			return err
		}
	} else if fi, err := os.Stat(dir); err != nil || !a.may(fi, 3) {
		return fmt.Errorf("pglocal: OS user %s cannot create sockets in %s (needs write and search permission)", a.name, dir)
	}
	return a.checkReachable(dir)
}

// checkReachable verifies that the server user may search every ancestor
// of dir. One 0700 parent (os.MkdirTemp, the parent of t.TempDir) makes the
// server fail obscurely; we report it rather than chmod the user's dirs.
func (a *account) checkReachable(dir string) error {
	for p := filepath.Dir(dir); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("pglocal: %w", err)
		}
		if !a.may(fi, 1) {
			return fmt.Errorf("pglocal: the server runs as OS user %s, which cannot traverse %s (mode %v, uid %d) to reach %s; make it traversable (e.g. chmod o+x %s) or use another directory",
				a.name, p, fi.Mode().Perm(), owner(fi), dir, p)
		}
		if p == filepath.Dir(p) {
			return nil
		}
	}
}

// may reports whether the server user has the permission bits want
// (4 read, 2 write, 1 search) on fi, by the classic owner/group/other rule.
func (a *account) may(fi fs.FileInfo, want fs.FileMode) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	perm := fi.Mode().Perm()
	switch {
	case !ok:
		return false
	case st.Uid == a.uid:
		return perm>>6&want == want
	case st.Gid == a.gid || slices.Contains(a.gids, st.Gid):
		return perm>>3&want == want
	default:
		return perm&want == want
	}
}

// writeFile atomically replaces path with content, owned by the server user
// (who must be able to read it; the file is 0600 like the rest of the
// data dir).
func (a *account) writeFile(path, content string) error {
	tmp := path + ".tmp"
	err := os.WriteFile(tmp, []byte(content), 0o600)
	if err == nil {
		err = a.chown(tmp)
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		return fmt.Errorf("pglocal: write %s: %w", path, err)
	}
	return nil
}

func (a *account) chown(path string) error {
	if a == nil {
		return nil
	}
	if err := os.Lchown(path, int(a.uid), int(a.gid)); err != nil {
		return fmt.Errorf("pglocal: %w", err)
	}
	return nil
}

func owner(fi fs.FileInfo) uint32 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Uid
	}
	return ^uint32(0)
}

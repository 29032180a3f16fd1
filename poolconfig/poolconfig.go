// Package poolconfig prepares pgx configurations for the outbox's
// processes: session limits (statement, lock and idle-in-transaction
// timeouts), a name in pg_stat_activity, and compatibility with a
// transaction-pooling proxy such as PgBouncer.
//
// The defaults per process (see [Relayer], [Producer], [Operator],
// [Migrator]):
//
//	process              application_name            statement  lock  idle in transaction
//	outbox relay         outbox-relay <relayer id>   30s        5s    60s
//	producer (enqueue)   outbox-producer             10s        5s    60s
//	operator commands    outbox-<command>            60s        5s    60s   (reap included)
//	audit, archive       outbox-audit                none       5s    60s
//	migrate              outbox-migrate              none       1m    60s   (1m: the migration lock's wait)
//
// Every process also bounds each connection attempt to one server at
// [DefaultConnectTimeout] (a URL's connect_timeout wins): a URL that names
// a primary and its standby (host=db1,db2&target_session_attrs=read-write,
// docs/operations.md "Failover") is tried host by host, and without a
// bound an attempt spends its caller's whole context on a first host that
// does not answer (a hung server, a black-holed address, where the kernel
// gives up on the handshake only after about two minutes), never reaching
// the second.
//
// A pool's connections also get a random part added to their lifetime
// ([LifetimeJitterFraction]), so that those opened together are not all
// renewed together.
//
// A lock timeout makes a statement that waits behind someone else's lock
// (an ACCESS EXCLUSIVE lock taken by hand, a long migration) fail with
// SQLSTATE 55P03 instead of hanging; the relayer's loops back off and try
// again, operator commands report it.
//
// Behind a transaction-pooling proxy (PgBouncer pool_mode = transaction)
// consecutive statements of one client may run on different server
// sessions, so: statements use pgx's exec mode (one round trip, unnamed
// statement; cached prepared statements would collide), LISTEN cannot work
// (relayers poll), session advisory locks cannot work (migrations refuse to
// run; migrate with a direct URL), and PgBouncer refuses the timeouts as
// startup parameters: set them on the database role instead (ALTER ROLE
// outbox_relayer SET statement_timeout = '30s', ...). application_name
// passes through. For the same reason outbox.tenant (row-level security)
// must be set per transaction or per login role there, never per
// connection: a per-connection setting stays on the server session and
// scopes the next client's transaction to the wrong tenant
// (docs/audit.md, "Tenants").
package poolconfig

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Pooler says what stands between the process and PostgreSQL.
type Pooler string

// Poolers.
const (
	// PoolerNone is a direct connection (or a session-mode pooler).
	PoolerNone Pooler = "none"
	// PoolerTransaction is a transaction-mode pooler (PgBouncer
	// pool_mode = transaction): one server session per transaction.
	PoolerTransaction Pooler = "transaction"
)

// ParsePooler parses a Pooler ("" is PoolerNone).
func ParsePooler(s string) (Pooler, error) {
	switch Pooler(s) {
	case "", PoolerNone:
		return PoolerNone, nil
	case PoolerTransaction:
		return PoolerTransaction, nil
	}
	return "", fmt.Errorf("unknown pooler %q (want none or transaction)", s)
}

// Settings are the session settings of one process's connections. A zero
// duration leaves the server's (or the role's) default. PostgreSQL takes
// the timeouts in whole milliseconds, where 0 means no timeout at all, so
// [Settings.Apply] rounds a duration up to the next millisecond: a positive
// timeout below 1 ms becomes 1 ms, never "no timeout", and no bound becomes
// shorter than asked.
type Settings struct {
	ApplicationName string
	// ConnectTimeout bounds each connection attempt to one server (pgx's
	// ConnectTimeout), unless the URL set connect_timeout; zero leaves
	// pgx's default, no bound.
	ConnectTimeout           time.Duration
	StatementTimeout         time.Duration
	LockTimeout              time.Duration
	IdleInTransactionTimeout time.Duration
	Pooler                   Pooler
}

// DefaultConnectTimeout is every process's Settings.ConnectTimeout: a
// connection to a live server takes milliseconds, also through PgBouncer.
const DefaultConnectTimeout = 10 * time.Second

// Relayer returns the defaults of a relayer (and a reaper) named id.
func Relayer(id string) Settings {
	return Settings{ApplicationName: "outbox-relay " + id, ConnectTimeout: DefaultConnectTimeout, StatementTimeout: 30 * time.Second,
		LockTimeout: 5 * time.Second, IdleInTransactionTimeout: time.Minute}
}

// Producer returns the defaults of a producer.
func Producer() Settings {
	return Settings{ApplicationName: "outbox-producer", ConnectTimeout: DefaultConnectTimeout, StatementTimeout: 10 * time.Second,
		LockTimeout: 5 * time.Second, IdleInTransactionTimeout: time.Minute}
}

// Operator returns the defaults of an operator or auditor command.
func Operator(command string) Settings {
	return Settings{ApplicationName: "outbox-" + command, ConnectTimeout: DefaultConnectTimeout, StatementTimeout: time.Minute,
		LockTimeout: 5 * time.Second, IdleInTransactionTimeout: time.Minute}
}

// Migrator returns the defaults of a migration: no statement timeout, and
// a minute for the migration lock and each lock a migration statement
// needs (migrations.Options.LockTimeout).
func Migrator() Settings {
	return Settings{ApplicationName: "outbox-migrate", ConnectTimeout: DefaultConnectTimeout, LockTimeout: time.Minute, IdleInTransactionTimeout: time.Minute}
}

// ErrInvalidSettings is wrapped by the errors [Settings.Validate] and
// [CheckTimeout] return.
var ErrInvalidSettings = errors.New("poolconfig: invalid settings")

// MaxTimeout is the longest statement, lock or idle-in-transaction timeout
// PostgreSQL takes: an int of milliseconds (24.8 days). A longer one is
// refused by the server at connect, on every connection.
const MaxTimeout = math.MaxInt32 * time.Millisecond

// CheckTimeout refuses a session timeout that [Settings.Apply] cannot send
// as asked: a negative one (a flipped sign, which Apply would drop, leaving
// the server's default, often no timeout at all) or one beyond
// [MaxTimeout]. Zero is valid: the server's or role's default.
func CheckTimeout(d time.Duration) error {
	switch {
	case d < 0:
		return fmt.Errorf("%w: %v is negative (0 means the server's or role's)", ErrInvalidSettings, d)
	case d > MaxTimeout:
		return fmt.Errorf("%w: %v is beyond PostgreSQL's longest, %v", ErrInvalidSettings, d, MaxTimeout)
	}
	return nil
}

// namedTimeout is one of Settings' server timeouts, by its parameter's name.
type namedTimeout struct {
	name string
	d    time.Duration
}

// timeouts are the server timeouts of s, which Validate checks and Apply
// sends.
func (s Settings) timeouts() []namedTimeout {
	return []namedTimeout{
		{"statement_timeout", s.StatementTimeout},
		{"lock_timeout", s.LockTimeout},
		{"idle_in_transaction_session_timeout", s.IdleInTransactionTimeout},
	}
}

// Validate refuses settings Apply cannot send as asked (see
// [CheckTimeout]), and a negative ConnectTimeout. Apply itself does not
// check: call Validate first on settings that come from a user.
func (s Settings) Validate() error {
	if s.ConnectTimeout < 0 {
		return fmt.Errorf("%w: connect timeout %v is negative", ErrInvalidSettings, s.ConnectTimeout)
	}
	for _, p := range s.timeouts() {
		if err := CheckTimeout(p.d); err != nil {
			return fmt.Errorf("%s: %w", p.name, err)
		}
	}
	return nil
}

// Apply sets s on cfg. It returns the settings it could not apply (the
// timeouts behind a transaction pooler), for the caller to log once.
// An application_name already in cfg (from the URL) wins.
func (s Settings) Apply(cfg *pgx.ConnConfig) (notApplied []string) {
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	if s.ApplicationName != "" && cfg.RuntimeParams["application_name"] == "" {
		cfg.RuntimeParams["application_name"] = truncateName(s.ApplicationName)
	}
	if s.ConnectTimeout > 0 && cfg.ConnectTimeout == 0 {
		// pgx bounds each host's attempt with it, then tries the next.
		cfg.ConnectTimeout = s.ConnectTimeout
	}
	for _, p := range s.timeouts() {
		if p.d <= 0 {
			continue
		}
		if s.Pooler == PoolerTransaction {
			notApplied = append(notApplied, p.name)
			continue
		}
		cfg.RuntimeParams[p.name] = strconv.FormatInt(ceilMilliseconds(p.d), 10)
	}
	if s.Pooler == PoolerTransaction {
		// One round trip with an unnamed statement: nothing outlives the
		// transaction, so nothing can meet another client's session.
		cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
		cfg.StatementCacheCapacity, cfg.DescriptionCacheCapacity = 0, 0
	}
	return notApplied
}

// ceilMilliseconds is d in whole milliseconds, rounded up: truncating
// would send a sub-millisecond timeout as 0, which disables it.
func ceilMilliseconds(d time.Duration) int64 {
	ms := d.Milliseconds()
	if d%time.Millisecond > 0 {
		ms++
	}
	return ms
}

// LifetimeJitterFraction says how much [Settings.ApplyPool] adds at random
// to each connection's lifetime: up to MaxConnLifetime /
// LifetimeJitterFraction (pgxpool draws it in whole seconds), unless the
// configuration has a jitter of its own (a URL's
// pool_max_conn_lifetime_jitter).
//
// pgxpool closes a connection at its first use past its lifetime (an hour
// by default). Connections opened together (every connection of every
// relayer, within seconds, once a restarted or failed-over database
// answers again) would otherwise reach it together, and every hour after
// that the whole fleet would reconnect at once: a backend fork and an
// authentication each on the primary, with the statements waiting for
// them. A quarter of an hour spreads an hour's renewals.
const LifetimeJitterFraction = 4

// ApplyPool sets s on a pool's connections (see [Settings.Apply]), spreads
// their lifetimes (see [LifetimeJitterFraction]) and, behind a transaction
// pooler, registers the types the outbox sends on every new connection
// ([RegisterTypes]).
func (s Settings) ApplyPool(cfg *pgxpool.Config) (notApplied []string) {
	notApplied = s.Apply(cfg.ConnConfig)
	if cfg.MaxConnLifetimeJitter == 0 && cfg.MaxConnLifetime > 0 {
		cfg.MaxConnLifetimeJitter = cfg.MaxConnLifetime / LifetimeJitterFraction
	}
	if s.Pooler == PoolerTransaction {
		prev := cfg.AfterConnect
		cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
			RegisterTypes(conn.TypeMap())
			if prev != nil {
				return prev(ctx, conn)
			}
			return nil
		}
	}
	return notApplied
}

// RegisterTypes registers the Go types the outbox sends as query
// arguments, so that query modes without a statement description (exec,
// behind a transaction pooler) know their PostgreSQL types.
func RegisterTypes(m *pgtype.Map) {
	m.RegisterDefaultPgType(uuid.UUID{}, "uuid")
	m.RegisterDefaultPgType([]uuid.UUID{}, "_uuid")
	m.RegisterDefaultPgType([][]byte{}, "_bytea")
	m.RegisterDefaultPgType([]time.Time{}, "_timestamptz")
}

// truncateName keeps an application_name within PostgreSQL's 63 bytes
// (NAMEDATALEN - 1) on a rune boundary; the server would cut it anyway,
// possibly mid-character.
func truncateName(s string) string {
	if len(s) <= 63 {
		return s
	}
	cut := 63
	for cut > 0 && s[cut]&0xC0 == 0x80 {
		cut--
	}
	return s[:cut]
}

package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/migrations"
	"github.com/ledgerline/outbox/pending"
)

// asBound connects as a login role of its own, a member of group, bound
// to tenants (migration 036) in the default schema, with outbox.tenant set
// to setting.
func (b *rolesBundle) asBound(t *testing.T, group, setting string, tenants ...string) *pgxpool.Pool {
	t.Helper()
	return b.connect(t, b.boundRole(t, group, "outbox", tenants...), setting)
}

// boundRole creates a login role, a member of group, bound to tenants in
// schema. Roles are cluster-wide, so each gets a fresh name, dropped after
// the test.
func (b *rolesBundle) boundRole(t *testing.T, group, schema string, tenants ...string) string {
	t.Helper()
	role := fmt.Sprintf("bound_%x", rand.Uint64())
	if _, err := b.admin.Exec(b.ctx, fmt.Sprintf("CREATE ROLE %s LOGIN IN ROLE %s", role, group)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := b.admin.Exec(context.Background(), "DROP ROLE IF EXISTS "+role); err != nil {
			t.Errorf("dropping %s: %v", role, err)
		}
	})
	for _, tenant := range tenants {
		if _, err := b.admin.Exec(b.ctx, `INSERT INTO `+schema+`.tenant_bindings (role_name, tenant_id) VALUES ($1, $2)`, role, tenant); err != nil {
			t.Fatal(err)
		}
	}
	return role
}

func isInsufficientPrivilege(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42501"
}

// TestBoundProducerCannotChooseAnotherTenant: outbox.tenant is the
// session's choice, so before bindings a producer credential of tenant A
// enqueued as B by setting it. Bound to A, it enqueues as A whatever the
// setting says, and nothing else: not with B's name, not with '*', not by
// calling the enqueue function on a key of B's.
func TestBoundProducerCannotChooseAnotherTenant(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	asA := b.asBound(t, migrations.RoleProducer, "tenant-a", "tenant-a")
	asB := b.asBound(t, migrations.RoleProducer, "tenant-b", "tenant-a")
	asAll := b.asBound(t, migrations.RoleProducer, "*", "tenant-a")
	unbound := b.as(t, migrations.RoleProducer, "tenant-b")

	if _, err := b.enqueue(t, asA, "tenant-a", "a-1"); err != nil {
		t.Fatalf("bound to A, setting A, enqueue for A: %v", err)
	}
	if _, err := b.enqueue(t, asAll, "tenant-a", "a-2"); err != nil {
		t.Fatalf("bound to A, setting *, enqueue for A: %v", err)
	}
	for name, db := range map[string]*pgxpool.Pool{"setting B": asB, "setting *": asAll} {
		if _, err := b.enqueue(t, db, "tenant-b", "b-by-a-"+name); !isInsufficientPrivilege(err) {
			t.Errorf("bound to A, %s, enqueue for B: %v, want 42501", name, err)
		}
	}
	if _, err := b.enqueue(t, unbound, "tenant-b", "b-1"); err != nil {
		t.Fatalf("an unbound producer, setting B: %v", err)
	}

	// A key of B's waiting for its instruction (inserted by hand, as the
	// owner): the bound producer with '*' may not make it an instruction.
	orphan := uuid.Must(uuid.NewV4())
	if _, err := b.admin.Exec(b.ctx, `INSERT INTO outbox.idempotency_keys (tenant_id, instruction_id, idempotency_key, outbox_id, participant_id, payload_hash)
		VALUES ('tenant-b', 'ins-orphan', 'orphan', $1, 'p-orphan', '\x00')`, orphan); err != nil {
		t.Fatal(err)
	}
	_, err := asAll.Exec(b.ctx, `SELECT outbox.enqueue_pending($1, 'sandbox', '', '{"amount_minor":1,"currency":"USD","destination":"x"}')`, orphan)
	if !isInsufficientPrivilege(err) {
		t.Errorf("bound to A, setting *, enqueue_pending on B's key: %v, want 42501", err)
	}
	_, err = asAll.Exec(b.ctx, `SELECT outbox.enqueue_pending_batch(ARRAY[$1::uuid], ARRAY['sandbox'], ARRAY[''], ARRAY['{"amount_minor":1,"currency":"USD","destination":"x"}'])`, orphan)
	if !isInsufficientPrivilege(err) {
		t.Errorf("bound to A, setting *, enqueue_pending_batch on B's key: %v, want 42501", err)
	}

	// What each sees of the keys: the binding, within the setting.
	for name, c := range map[string]struct {
		db   *pgxpool.Pool
		want []string
	}{
		"bound to A, setting A": {asA, []string{"tenant-a"}},
		"bound to A, setting *": {asAll, []string{"tenant-a"}},
		"bound to A, setting B": {asB, nil},
	} {
		if got := tenantsSeen(t, b.ctx, c.db, "idempotency_keys"); !slices.Equal(got, c.want) {
			t.Errorf("%s sees keys of %v, want %v", name, got, c.want)
		}
	}
	var pendingB int
	if err := b.admin.QueryRow(b.ctx, `SELECT count(*) FROM outbox.pending WHERE tenant_id = 'tenant-b'`).Scan(&pendingB); err != nil || pendingB != 1 {
		t.Errorf("tenant B has %d pending (%v), want the unbound producer's 1", pendingB, err)
	}

	// A producer reads its own login role's bindings only.
	var own, all int
	if err := asA.QueryRow(b.ctx, `SELECT count(*) FROM outbox.tenant_bindings`).Scan(&own); err != nil {
		t.Fatal(err)
	}
	if err := b.admin.QueryRow(b.ctx, `SELECT count(*) FROM outbox.tenant_bindings`).Scan(&all); err != nil {
		t.Fatal(err)
	}
	if own != 1 || all < 3 {
		t.Errorf("a bound producer reads %d bindings of %d, want its own 1", own, all)
	}
	refused(t, b.ctx, asA, `INSERT INTO outbox.tenant_bindings (role_name, tenant_id) VALUES (session_user, 'tenant-b')`,
		`DELETE FROM outbox.tenant_bindings`, `UPDATE outbox.tenant_bindings SET tenant_id = 'tenant-b'`)

	// A binding taken away applies to the next statement: the setting
	// alone scopes again.
	var role string
	if err := asB.QueryRow(b.ctx, "SELECT session_user").Scan(&role); err != nil {
		t.Fatal(err)
	}
	if _, err := b.admin.Exec(b.ctx, `DELETE FROM outbox.tenant_bindings WHERE role_name = $1`, role); err != nil {
		t.Fatal(err)
	}
	if _, err := b.enqueue(t, asB, "tenant-b", "b-2"); err != nil {
		t.Errorf("unbound again, setting B, enqueue for B: %v", err)
	}
}

// TestBoundReadersAndOperatorsStayInTheirTenants: an auditor or operator
// bound to A reads A's rows only, with '*' too, and an operator bound to A
// cannot act on B's instructions (its functions run as the owner and apply
// the binding themselves); bound to the rows without a tenant (the empty
// string), it reads only those.
func TestBoundReadersAndOperatorsStayInTheirTenants(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	relayer := b.as(t, migrations.RoleRelayer, "")
	for _, tenant := range []string{"tenant-a", "tenant-b", ""} {
		if _, err := b.enqueue(t, b.as(t, migrations.RoleProducer, tenant), tenant, tenant+"-settled"); err != nil {
			t.Fatal(err)
		}
	}
	if got := b.settle(t, relayer, store.Dispatched); len(got) != 3 {
		t.Fatalf("settled %d, want 3", len(got))
	}
	pendingOf := map[string]uuid.UUID{}
	for _, tenant := range []string{"tenant-a", "tenant-b"} {
		r, err := b.enqueue(t, b.as(t, migrations.RoleProducer, tenant), tenant, tenant+"-pending")
		if err != nil {
			t.Fatal(err)
		}
		pendingOf[tenant] = r.OutboxID
	}

	for name, c := range map[string]struct {
		db   *pgxpool.Pool
		want []string
	}{
		"auditor bound to A, setting *":    {b.asBound(t, migrations.RoleAuditor, "*", "tenant-a"), []string{"tenant-a"}},
		"auditor bound to A, setting B":    {b.asBound(t, migrations.RoleAuditor, "tenant-b", "tenant-a"), nil},
		"auditor bound to A and B, *":      {b.asBound(t, migrations.RoleAuditor, "*", "tenant-a", "tenant-b"), []string{"tenant-a", "tenant-b"}},
		"auditor bound to no tenant, *":    {b.asBound(t, migrations.RoleAuditor, "*", ""), []string{""}},
		"operator bound to A, setting *":   {b.asBound(t, migrations.RoleOperator, "*", "tenant-a"), []string{"tenant-a"}},
		"auditor unbound, setting * (all)": {b.as(t, migrations.RoleAuditor, "*"), []string{"", "tenant-a", "tenant-b"}},
	} {
		for _, table := range []string{"idempotency_keys", "attempts"} {
			if got := tenantsSeen(t, b.ctx, c.db, table); !slices.Equal(got, c.want) {
				t.Errorf("%s sees %s of %q, want %q", name, table, got, c.want)
			}
		}
	}

	operator := b.asBound(t, migrations.RoleOperator, "*", "tenant-a")
	// Who may act for which tenant is part of what auditors and operators
	// read: every binding, their own or not.
	var all int
	if err := b.admin.QueryRow(b.ctx, `SELECT count(*) FROM outbox.tenant_bindings`).Scan(&all); err != nil {
		t.Fatal(err)
	}
	for name, db := range map[string]*pgxpool.Pool{"auditor": b.as(t, migrations.RoleAuditor, "tenant-a"), "bound operator": operator} {
		var n int
		if err := db.QueryRow(b.ctx, `SELECT count(*) FROM outbox.tenant_bindings`).Scan(&n); err != nil || n != all || all < 7 {
			t.Errorf("%s reads %d bindings (%v), want all %d", name, n, err, all)
		}
	}
	if ok, err := b.st.Cancel(b.ctx, operator, pendingOf["tenant-b"], "olga", "test"); err != nil || ok {
		t.Errorf("operator bound to A cancels B's instruction: %v, %v; want not there", ok, err)
	}
	if ok, err := b.st.Cancel(b.ctx, operator, pendingOf["tenant-a"], "olga", "test"); err != nil || !ok {
		t.Errorf("operator bound to A cancels A's instruction: %v, %v; want done", ok, err)
	}
	var stillB int
	if err := b.admin.QueryRow(b.ctx, `SELECT count(*) FROM outbox.pending WHERE outbox_id = $1`, pendingOf["tenant-b"]).Scan(&stillB); err != nil || stillB != 1 {
		t.Errorf("B's instruction pending: %d (%v), want 1", stillB, err)
	}
	rep, err := b.st.Verify(b.ctx, b.admin, store.VerifyOptions{Ordered: true})
	if err != nil || !rep.OK() {
		t.Fatalf("verify: %+v, %v", rep, err)
	}
}

// tenantsSeen is the distinct tenants (the empty string for none) of
// table's rows that db reads.
func tenantsSeen(t *testing.T, ctx context.Context, db *pgxpool.Pool, table string) []string {
	t.Helper()
	var got []string
	if err := db.QueryRow(ctx, fmt.Sprintf(`SELECT coalesce(array_agg(DISTINCT coalesce(tenant_id, '') ORDER BY coalesce(tenant_id, '')), '{}') FROM outbox.%s`, table)).
		Scan(&got); err != nil {
		t.Fatal(err)
	}
	if len(got) == 0 {
		return nil
	}
	return got
}

// rolesBefore036 is the roles script sql as builds before migration 036
// had it: tenant policies without bindings, no tenant_bindings table.
func rolesBefore036(sql string) string {
	sql = rolesBefore042(sql)
	sql = regexp.MustCompile(`\s*AND coalesce\(tenant_id, ''\) = ANY \(coalesce\(\(SELECT array_agg\(b\.tenant_id\) FROM [a-z_]*\.tenant_bindings b WHERE b\.role_name = session_user\), ARRAY\[coalesce\(tenant_id, ''\)\]\)\)`).
		ReplaceAllString(sql, "")
	var lines []string
	for _, line := range strings.Split(sql, "\n") {
		if !strings.Contains(line, "tenant_bindings") {
			lines = append(lines, line)
		}
	}
	return strings.Join(lines, "\n")
}

// rolesAt035 migrates schema to version 35 and sets its roles up as the
// build of that version did.
func (b *rolesBundle) rolesAt035(t *testing.T, schema string) {
	t.Helper()
	if err := migrations.MigrateWith(b.ctx, b.admin, migrations.Options{Schema: schema, TargetVersion: 35}); err != nil {
		t.Fatal(err)
	}
	sql, err := migrations.RolesSQL(schema)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.admin.Exec(b.ctx, rolesBefore036(sql)); err != nil {
		t.Fatalf("roles at version 35: %v", err)
	}
}

// TestBindingsHoldAfterAnUpgradeByTheOwner: on a schema whose roles were
// set up before migration 036, the migration run by the owner alone (no
// second --create-roles) puts the bindings into the tenant policies
// already in place, and producers keep enqueueing.
func TestBindingsHoldAfterAnUpgradeByTheOwner(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	const schema = "bound_upgrade"
	b.rolesAt035(t, schema)
	if err := migrations.MigrateWith(b.ctx, b.as(t, migrations.RoleOwner, ""), migrations.Options{Schema: schema}); err != nil {
		t.Fatalf("upgrade as the owner: %v", err)
	}
	producer, err := pending.NewProducer(pending.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	enqueue := func(db *pgxpool.Pool, tenant, key string) error {
		_, err := producer.Enqueue(b.ctx, db, pending.Instruction{
			InstructionID: "ins-" + key, ParticipantID: "p-" + key, IdempotencyKey: key, TenantID: tenant,
			RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1",
		})
		return err
	}
	if err := enqueue(b.as(t, migrations.RoleProducer, "tenant-b"), "tenant-b", "unbound"); err != nil {
		t.Fatalf("an unbound producer after the upgrade: %v", err)
	}
	bound := b.connect(t, b.boundRole(t, migrations.RoleProducer, schema, "tenant-a"), "tenant-b")
	var pgErr *pgconn.PgError
	if err := enqueue(bound, "tenant-b", "bound"); !errors.As(err, &pgErr) || !strings.Contains(pgErr.Message, "row-level security") {
		t.Errorf("bound to A, setting B, after the upgrade: %v, want the tenant policy's refusal", err)
	}
	if err := enqueue(bound, "tenant-a", "bound"); !errors.As(err, &pgErr) || !strings.Contains(pgErr.Message, "row-level security") {
		t.Errorf("bound to A, setting B, enqueue for A after the upgrade: %v, want the tenant policy's refusal (the setting still chooses)", err)
	}
	// Migration 038, run by the owner: the enqueue functions keep their
	// standing (the unbound producer above enqueued through them) and
	// refuse the bound producer a key of the tenant it sets, inserted
	// without its instruction.
	orphan := uuid.Must(uuid.NewV4())
	if _, err := b.admin.Exec(b.ctx, `INSERT INTO `+schema+`.idempotency_keys (tenant_id, instruction_id, idempotency_key, outbox_id, participant_id, payload_hash)
		VALUES ('tenant-b', 'ins-orphan', 'k-orphan', $1, 'p-orphan', '\x00')`, orphan); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`SELECT ` + schema + `.enqueue_pending($1, 'sandbox', '', '{}')`,
		`SELECT ` + schema + `.enqueue_pending_batch(ARRAY[$1::uuid], ARRAY['sandbox'], ARRAY[''], ARRAY['{}'])`,
	} {
		if _, err := bound.Exec(b.ctx, q, orphan); !errors.As(err, &pgErr) || pgErr.Code != "42501" || !strings.Contains(pgErr.Message, "not bound") {
			t.Errorf("bound to A, setting B, after the upgrade: %s on B's key: %v, want the binding's 42501", q, err)
		}
	}
	var stamped bool
	if err := b.admin.QueryRow(b.ctx, `SELECT sequence_id IS NOT NULL FROM `+schema+`.idempotency_keys WHERE outbox_id = $1`, orphan).Scan(&stamped); err != nil || stamped {
		t.Errorf("B's key after the refusals: stamped %v (%v), want without its instruction", stamped, err)
	}
}

// TestBoundProducerCannotCompleteAKeyOfTheTenantItSets: the enqueue
// functions run as the owner, which row-level security does not filter.
// Before migration 038 they applied the binding only to a key of another
// tenant than outbox.tenant, so a producer bound to A with the setting B
// made a key of B inserted without its instruction (its outbox id known)
// a payment of B, with the rail and payload it chose. Now they refuse it
// (42501, as a key of another tenant) by either form and write nothing;
// a key within the bindings, an unbound producer and the owner complete
// such a key as before.
func TestBoundProducerCannotCompleteAKeyOfTheTenantItSets(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	// orphan inserts a key of tenant, as the owner, with no instruction.
	orphan := func(tenant string) uuid.UUID {
		t.Helper()
		id := uuid.Must(uuid.NewV4())
		if _, err := b.admin.Exec(b.ctx, `INSERT INTO outbox.idempotency_keys (tenant_id, instruction_id, idempotency_key, outbox_id, participant_id, payload_hash)
			VALUES ($1, 'ins-'||$2, 'k-'||$2, $2::uuid, 'p-'||$2, '\x00')`, tenant, id.String()); err != nil {
			t.Fatal(err)
		}
		return id
	}
	const payload = `{"amount_minor":1,"currency":"USD","destination":"x"}`
	single := func(db *pgxpool.Pool, id uuid.UUID) error {
		_, err := db.Exec(b.ctx, `SELECT outbox.enqueue_pending($1, 'sandbox', '', $2)`, id, payload)
		return err
	}
	batch := func(db *pgxpool.Pool, id uuid.UUID) error {
		_, err := db.Exec(b.ctx, `SELECT outbox.enqueue_pending_batch(ARRAY[$1::uuid], ARRAY['sandbox'], ARRAY[''], ARRAY[$2])`, id, payload)
		return err
	}
	// completed is whether the key's instruction exists: its pending row,
	// its participant's sequence and its key's sequence id, all or none.
	completed := func(id uuid.UUID) bool {
		t.Helper()
		var rows, seqs int
		var stamped bool
		if err := b.admin.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM outbox.pending WHERE outbox_id = $1),
			(SELECT count(*) FROM outbox.sequences WHERE participant_id = 'p-'||$1::uuid::text),
			(SELECT sequence_id IS NOT NULL FROM outbox.idempotency_keys WHERE outbox_id = $1)`, id).Scan(&rows, &seqs, &stamped); err != nil {
			t.Fatal(err)
		}
		if !(rows == 0 && seqs == 0 && !stamped) && !(rows == 1 && seqs == 1 && stamped) {
			t.Errorf("key %s half completed: %d pending, %d sequences, stamped %v", id, rows, seqs, stamped)
		}
		return rows == 1
	}
	calls := map[string]func(*pgxpool.Pool, uuid.UUID) error{"enqueue_pending": single, "enqueue_pending_batch": batch}

	for name, c := range map[string]struct {
		db     *pgxpool.Pool
		tenant string
	}{
		"bound to A, setting B, a key of B":                {b.asBound(t, migrations.RoleProducer, "tenant-b", "tenant-a"), "tenant-b"},
		"bound to A, setting none, a key without a tenant": {b.asBound(t, migrations.RoleProducer, "", "tenant-a"), ""},
		"bound to no tenant, setting B, a key of B":        {b.asBound(t, migrations.RoleProducer, "tenant-b", ""), "tenant-b"},
		"bound to A and C, setting B, a key of B":          {b.asBound(t, migrations.RoleProducer, "tenant-b", "tenant-a", "tenant-c"), "tenant-b"},
	} {
		for fn, call := range calls {
			id := orphan(c.tenant)
			var pgErr *pgconn.PgError
			if err := call(c.db, id); !errors.As(err, &pgErr) || pgErr.Code != "42501" || !strings.Contains(pgErr.Message, "not bound") {
				t.Errorf("%s, %s: %v, want the binding's 42501", name, fn, err)
			}
			if completed(id) {
				t.Errorf("%s, %s: the key became an instruction", name, fn)
			}
		}
	}

	for name, c := range map[string]struct {
		db     *pgxpool.Pool
		tenant string
	}{
		"bound to A and B, setting B, a key of B": {b.asBound(t, migrations.RoleProducer, "tenant-b", "tenant-a", "tenant-b"), "tenant-b"},
		"bound to no tenant, a key without one":   {b.asBound(t, migrations.RoleProducer, "", ""), ""},
		"unbound, setting B, a key of B":          {b.as(t, migrations.RoleProducer, "tenant-b"), "tenant-b"},
		"the owner, setting B, a key of B":        {b.as(t, migrations.RoleOwner, "tenant-b"), "tenant-b"},
		"the owner, setting none, a key of B":     {b.as(t, migrations.RoleOwner, ""), "tenant-b"},
		"a superuser, a key of B":                 {b.admin, "tenant-b"},
	} {
		for fn, call := range calls {
			id := orphan(c.tenant)
			if err := call(c.db, id); err != nil {
				t.Errorf("%s, %s: %v", name, fn, err)
			}
			if !completed(id) {
				t.Errorf("%s, %s: the key is still without its instruction", name, fn)
			}
		}
	}

	// A bound producer's own enqueues, one and a batch, as before.
	asA := b.asBound(t, migrations.RoleProducer, "tenant-a", "tenant-a")
	if _, err := b.enqueue(t, asA, "tenant-a", "a-own"); err != nil {
		t.Errorf("bound to A, setting A, enqueue for A: %v", err)
	}
	if rs, err := b.producer.EnqueueBatch(b.ctx, asA, []pending.Instruction{
		{InstructionID: "ins-a1", ParticipantID: "p-a", IdempotencyKey: "k-a1", TenantID: "tenant-a", RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1"},
		{InstructionID: "ins-a2", ParticipantID: "p-a", IdempotencyKey: "k-a2", TenantID: "tenant-a", RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1"},
	}); err != nil || rs[0].SequenceID != 1 || rs[1].SequenceID != 2 {
		t.Errorf("bound to A, setting A, a batch for A: %+v, %v; want sequences 1 and 2", rs, err)
	}
}

// TestUpgradeByASuperuserRunsAsTheOwner: on a schema whose roles were set
// up before migration 036, an upgrade run by a superuser without a second
// --create-roles runs its migrations as the schema's owner, so everything
// they create (036's tenant_bindings, later functions that run as their
// owner) belongs to outbox_owner, as after an upgrade by the owner. It
// used to belong to the superuser: functions that run as their owner then
// ran as a superuser, and the owner's own functions could not read the
// bindings table, so every producer's enqueue was refused until
// --create-roles ran again.
func TestUpgradeByASuperuserRunsAsTheOwner(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	const schema = "superuser_upgrade"
	b.rolesAt035(t, schema)
	if err := migrations.MigrateWith(b.ctx, b.admin, migrations.Options{Schema: schema}); err != nil {
		t.Fatalf("upgrade as a superuser: %v", err)
	}
	rows, err := b.admin.Query(b.ctx, `
		SELECT 'relation ' || c.relname || ' owned by ' || pg_get_userbyid(c.relowner) FROM pg_class c
		WHERE c.relnamespace = $1::regnamespace AND pg_get_userbyid(c.relowner) <> 'outbox_owner'
		UNION ALL
		SELECT 'function ' || p.oid::regprocedure || ' owned by ' || pg_get_userbyid(p.proowner) FROM pg_proc p
		WHERE p.pronamespace = $1::regnamespace AND pg_get_userbyid(p.proowner) <> 'outbox_owner'
		ORDER BY 1`, schema)
	if err != nil {
		t.Fatal(err)
	}
	strays, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range strays {
		t.Errorf("after the superuser's upgrade: %s, want outbox_owner", s)
	}
	producer, err := pending.NewProducer(pending.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := producer.Enqueue(b.ctx, b.as(t, migrations.RoleProducer, "tenant-a"), pending.Instruction{
		InstructionID: "ins-1", ParticipantID: "p-1", IdempotencyKey: "k-1", TenantID: "tenant-a",
		RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1",
	}); err != nil {
		t.Fatalf("a producer's enqueue after the superuser's upgrade: %v", err)
	}
}

// TestBoundProducerRefusalIsTyped: an enqueue the database refuses for
// want of a privilege (42501), here a producer bound to A enqueuing for B,
// is pending.ErrPermissionDenied with the database's error in it, for one
// instruction and for a batch, and writes nothing. It was the database's
// untyped error, which a caller could tell from its own mistakes only by
// the SQLSTATE. A batch's savepoint keeps the caller's transaction usable;
// a single enqueue's refused statement aborts it, as any refused
// statement does.
func TestBoundProducerRefusalIsTyped(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	asA := b.asBound(t, migrations.RoleProducer, "tenant-b", "tenant-a")
	in := func(key string) pending.Instruction {
		return pending.Instruction{InstructionID: "ins-" + key, ParticipantID: "p-" + key, IdempotencyKey: key, TenantID: "tenant-b",
			RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1"}
	}
	for _, n := range []int{1, 2} {
		tx, err := asA.Begin(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		ins := []pending.Instruction{in(fmt.Sprintf("b-%d-1", n)), in(fmt.Sprintf("b-%d-2", n))}[:n]
		_, err = b.producer.EnqueueBatch(b.ctx, tx, ins)
		if !errors.Is(err, pending.ErrPermissionDenied) || !isInsufficientPrivilege(err) {
			t.Errorf("batch of %d for another tenant: %v, want pending.ErrPermissionDenied with the database's 42501 in it", n, err)
		}
		var one int
		if usable := tx.QueryRow(b.ctx, `SELECT 1`).Scan(&one); n > 1 && usable != nil {
			t.Errorf("batch of %d: the transaction is unusable after the refusal: %v", n, usable)
		}
		_ = tx.Rollback(b.ctx)
	}
	if _, err := b.producer.Enqueue(b.ctx, asA, in("b-one")); !errors.Is(err, pending.ErrPermissionDenied) {
		t.Errorf("Enqueue for another tenant: %v, want pending.ErrPermissionDenied", err)
	}
	var n int
	if err := b.admin.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM outbox.pending) + (SELECT count(*) FROM outbox.idempotency_keys)`).Scan(&n); err != nil || n != 0 {
		t.Errorf("refused enqueues wrote %d rows (%v)", n, err)
	}
}

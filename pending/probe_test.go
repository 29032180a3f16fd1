package pending_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/pending"
)

func TestProbe(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := b.ctx
	// twin keys different payloads in batch
	a := payout("p1", "tw")
	c := payout("p1", "tw")
	c.AmountMinor = 99
	_, err := b.producer.EnqueueBatch(ctx, b.pool, []pending.Instruction{a, c})
	t.Logf("twins diff payload: %v (mismatch? %v)", err, errors.Is(err, pending.ErrIdempotencyMismatch))
	t.Logf("counts %+v", b.counts(t))

	// read-only tx
	for _, n := range []int{1, 2} {
		tx, _ := b.pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
		var ins []pending.Instruction
		for i := range n {
			ins = append(ins, payout("p-ro", "ro"+string(rune('a'+i))+string(rune('0'+n))))
		}
		_, err := b.producer.EnqueueBatch(ctx, tx, ins)
		t.Logf("read-only n=%d: %v", n, err)
		var one int
		err = tx.QueryRow(ctx, "SELECT 1").Scan(&one)
		t.Logf("  tx usable after: %v", err)
		tx.Rollback(ctx)
	}
	// aborted tx
	tx, _ := b.pool.Begin(ctx)
	tx.Exec(ctx, "SELECT 1/0")
	_, err = b.producer.Enqueue(ctx, tx, payout("p-ab", "ab1"))
	t.Logf("aborted: %v", err)
	tx.Rollback(ctx)
	// serializable
	tx, _ = b.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.Serializable})
	_, err = b.producer.EnqueueBatch(ctx, tx, []pending.Instruction{payout("p-s", "s1"), payout("p-s", "s2")})
	t.Logf("serializable: %v commit %v", err, tx.Commit(ctx))

	// cancelled ctx mid enqueue
	tx, _ = b.pool.Begin(ctx)
	tx.Exec(ctx, "INSERT INTO outbox.settings SELECT * FROM outbox.settings WHERE false")
	cctx, cancel := context.WithTimeout(ctx, time.Millisecond)
	defer cancel()
	time.Sleep(2 * time.Millisecond)
	_, err = b.producer.Enqueue(cctx, tx, payout("p-c", "c1"))
	t.Logf("cancelled: %v", err)
	t.Logf("  commit: %v", tx.Commit(ctx))

	// edges
	for name, in := range map[string]pending.Instruction{
		"maxint":   func() pending.Instruction { i := payout("p", "mx"); i.AmountMinor = math.MaxInt64; return i }(),
		"neg":      func() pending.Instruction { i := payout("p", "ng"); i.AmountMinor = -1; return i }(),
		"zero":     func() pending.Instruction { i := payout("p", "zr"); i.AmountMinor = 0; return i }(),
		"lowercur": func() pending.Instruction { i := payout("p", "lc"); i.Currency = "usd"; return i }(),
		"xxx":      func() pending.Instruction { i := payout("p", "xx"); i.Currency = "XXX"; return i }(),
		"jpy":      func() pending.Instruction { i := payout("p", "jp"); i.Currency = "JPY"; return i }(),
		"nul":      func() pending.Instruction { i := payout("p", "nu"); i.InstructionID = "a\x00b"; return i }(),
		"emptyid":  func() pending.Instruction { i := payout("p", "em"); i.InstructionID = ""; return i }(),
		"longid":   func() pending.Instruction { i := payout("p", "lo"); i.InstructionID = strings.Repeat("a", 100000); return i }(),
		"longkey":  func() pending.Instruction { i := payout("p", strings.Repeat("k", 3000)); return i }(),
		"longpart": func() pending.Instruction { i := payout(strings.Repeat("p", 3000), "lp"); return i }(),
		"longdest": func() pending.Instruction { i := payout("p", "ld"); i.Destination = strings.Repeat("d", 3000); return i }(),
		"longcorr": func() pending.Instruction { i := payout("p", "lcr"); i.CorrelationID = strings.Repeat("d", 3000); return i }(),
		"longten":  func() pending.Instruction { i := payout("p", "lt"); i.TenantID = strings.Repeat("d", 3000); return i }(),
		"metanull": func() pending.Instruction { i := payout("p", "mn"); i.Metadata = []byte("null"); return i }(),
		"metaarr":  func() pending.Instruction { i := payout("p", "ma"); i.Metadata = []byte("[]"); return i }(),
		"metastr":  func() pending.Instruction { i := payout("p", "ms"); i.Metadata = []byte(`"x"`); return i }(),
		"metaempty":  func() pending.Instruction { i := payout("p", "me"); i.Metadata = []byte(`  `); return i }(),
		"metanulbyte":  func() pending.Instruction { i := payout("p", "mnb"); i.Metadata = []byte("{\"a\":\"\\u0000\"}"); return i }(),
		"railnone":  func() pending.Instruction { i := payout("p", "rn"); i.RailType = ""; return i }(),
	} {
		tx, _ := b.pool.Begin(ctx)
		r, err := b.producer.Enqueue(ctx, tx, in)
		var one int
		uerr := tx.QueryRow(ctx, "SELECT 1").Scan(&one)
		t.Logf("%s: %v %v usable=%v", name, r, trunc(err), uerr)
		tx.Rollback(ctx)
	}
	// pool, simple protocol
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeExec, pgx.QueryExecModeCacheDescribe} {
		cfg := b.pool.Config().Copy()
		cfg.ConnConfig.DefaultQueryExecMode = mode
		p, _ := pgxpool.NewWithConfig(ctx, cfg)
		pr, _ := pending.NewProducer(pending.Config{})
		_, err := pr.Enqueue(ctx, p, payout("pm", "m"+mode.String()))
		_, err2 := pr.EnqueueBatch(ctx, p, []pending.Instruction{payout("pm", "mb1"+mode.String()), payout("pm", "mb2"+mode.String())})
		i := payout("pm", "m"+mode.String())
		i.AmountMinor = 5
		_, err3 := pr.Enqueue(ctx, p, i)
		t.Logf("mode %v: %v %v mismatch=%v", mode, err, err2, err3)
		p.Close()
	}
}

func trunc(err error) string {
	if err == nil {
		return "<nil>"
	}
	s := err.Error()
	if len(s) > 200 {
		return s[:200]
	}
	return s
}

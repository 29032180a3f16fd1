package store_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerline/outbox/internal/store"
)

// rowsTracer records how many rows each statement reading the
// checkpoints returned.
type rowsTracer struct {
	mu   sync.Mutex
	rows []int64
	// handed counts what a countingSource handed out.
	handed int
}

func (r *rowsTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, r, d.SQL)
}

func (r *rowsTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if q, _ := ctx.Value(r).(string); strings.Contains(q, "checkpoints") && d.Err == nil {
		r.rows = append(r.rows, d.CommandTag.RowsAffected())
	}
}

// TestCheckpointsExportIsReadInBatches: outbox audit checkpoints read
// every checkpoint into memory before writing the first line: one a
// minute is half a million a year, millions after a few years, held at
// once in the CLI. The export reads them a batch at a time (here two), and
// writes the same export as before.
func TestCheckpointsExportIsReadInBatches(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	const checkpoints, batch = 5, 2
	for i := range checkpoints {
		p := fmt.Sprintf("p-export-%d", i)
		b.enqueue(t, p, "k-"+p)
		b.record(t, recordOutcome(t, b.claimOne(t, "r1", longLease), "r1", store.Dispatched))
		b.checkpoint(t)
	}
	want, err := b.st.Checkpoints(b.ctx, b.pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(want) != checkpoints {
		t.Fatalf("%d checkpoints, want %d", len(want), checkpoints)
	}

	tracer := &rowsTracer{}
	cfg := b.pool.Config().ConnConfig.Copy()
	cfg.Tracer = tracer
	conn, err := pgx.ConnectConfig(b.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(b.ctx)
	var out bytes.Buffer
	if err := store.WithCheckpointBatch(b.st, batch).ExportCheckpoints(b.ctx, conn, &out); err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, n := range tracer.rows {
		if n > batch {
			t.Errorf("a statement read %d checkpoints at once, want at most %d (all reads: %v)", n, batch, tracer.rows)
		}
		total += n
	}
	if total != checkpoints {
		t.Errorf("the statements read %d checkpoints in all (%v), want %d", total, tracer.rows, checkpoints)
	}
	var whole bytes.Buffer
	if err := store.WriteCheckpoints(&whole, want); err != nil {
		t.Fatal(err)
	}
	if out.String() != whole.String() {
		t.Errorf("the export differs from WriteCheckpoints' of every checkpoint:\n%s\n%s", out.String(), whole.String())
	}
	if got, err := store.ReadCheckpoints(&out); err != nil || len(got) != checkpoints {
		t.Errorf("the export reads back as %d checkpoints (%v), want %d", len(got), err, checkpoints)
	}
}

package store_test

import (
	"bytes"
	"fmt"
	"reflect"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerline/outbox/internal/store"
)

// countingSource hands out cps in order and records, at each checkpoint
// it hands out, how many more it has handed out than the database's
// checkpoints verify has read so far (tracer's rows): how many of the
// export verify holds.
type countingSource struct {
	cps    []store.Checkpoint
	tracer *rowsTracer
	held   int
}

func (c *countingSource) Next() (store.Checkpoint, bool, error) {
	if len(c.cps) == 0 {
		return store.Checkpoint{}, false, nil
	}
	next := c.cps[0]
	c.cps = c.cps[1:]
	c.tracer.mu.Lock()
	var read int64
	for _, n := range c.tracer.rows {
		read += n
	}
	c.tracer.mu.Unlock()
	handed := int64(c.tracer.handed + 1)
	c.tracer.handed++
	c.held = max(c.held, int(handed-read))
	return next, true, nil
}

// TestExportIsComparedAsItIsRead: audit verify --checkpoints held the
// whole export (and two maps of it): after years, millions of checkpoints
// in the auditor's process. An export handed out a checkpoint at a time
// (VerifyOptions.CheckpointsFrom, a CheckpointsReader) is compared with
// the database's as verify reads them, one batch (here one checkpoint) at
// a time, and reads at most one checkpoint of the export ahead of them
// (besides those it reports as not in the database and drops).
// The report is the one the whole export gives, with checkpoints that
// differ and ones the database does not have.
func TestExportIsComparedAsItIsRead(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	const checkpoints = 5
	for i := range checkpoints {
		p := fmt.Sprintf("p-stream-%d", i)
		b.enqueue(t, p, "k-"+p)
		b.record(t, recordOutcome(t, b.claimOne(t, "r1", longLease), "r1", store.Dispatched))
		b.checkpoint(t)
	}
	var out bytes.Buffer
	if err := b.st.ExportCheckpoints(b.ctx, b.pool, &out); err != nil {
		t.Fatal(err)
	}
	export, err := store.ReadCheckpoints(bytes.NewReader(out.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	// Checkpoints the database never had: before its first, and between
	// two of its own.
	before, between := export[0], export[2]
	before.PeriodStart, before.PeriodEnd = before.PeriodStart.AddDate(-1, 0, 0), before.PeriodEnd.AddDate(-1, 0, 0)
	between.PeriodStart = between.PeriodStart.Add(1)
	withExtra := append([]store.Checkpoint{before}, export[:3]...)
	withExtra = append(withExtra, between)
	withExtra = append(withExtra, export[3:]...)

	cfg := b.pool.Config().ConnConfig.Copy()
	tracer := &rowsTracer{}
	cfg.Tracer = tracer
	conn, err := pgx.ConnectConfig(b.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(b.ctx)
	batched := store.WithCheckpointBatch(b.st, 1)

	for _, tampered := range []bool{false, true} {
		if tampered {
			b.execAll(t, `SET session_replication_role = replica`,
				`UPDATE outbox.checkpoints SET row_count = row_count + 1 WHERE period_start = (SELECT max(period_start) FROM outbox.checkpoints)`)
		}
		for _, cps := range [][]store.Checkpoint{export, withExtra} {
			whole, err := b.st.Verify(b.ctx, b.pool, store.VerifyOptions{Ordered: true, Checkpoints: cps})
			if err != nil {
				t.Fatal(err)
			}
			tracer.mu.Lock()
			tracer.rows, tracer.handed = nil, 0
			tracer.mu.Unlock()
			src := &countingSource{cps: cps, tracer: tracer}
			streamed, err := batched.Verify(b.ctx, conn, store.VerifyOptions{Ordered: true, CheckpointsFrom: src})
			if err != nil {
				t.Fatal(err)
			}
			// One ahead, plus those the database does not have, each
			// dropped once reported.
			if bound := 1 + len(cps) - checkpoints; src.held > bound {
				t.Errorf("verify held %d checkpoints of the export ahead of the database's (tampered %v, %d exported), want at most %d", src.held, tampered, len(cps), bound)
			}
			whole.Duration, streamed.Duration = 0, 0
			if !reflect.DeepEqual(whole, streamed) {
				t.Errorf("the export read a checkpoint at a time gives another report (tampered %v, %d exported):\n%+v\n%+v", tampered, len(cps), streamed, whole)
			}
			if wantOK := !tampered && len(cps) == checkpoints; whole.OK() != wantOK {
				t.Errorf("tampered %v, %d exported: verify says ok %v: %v", tampered, len(cps), whole.OK(), whole.Violations)
			}
		}
	}
	// The reader of the export file hands it out the same way.
	streamed, err := b.st.Verify(b.ctx, b.pool, store.VerifyOptions{Ordered: true, CheckpointsFrom: store.NewCheckpointsReader(bytes.NewReader(out.Bytes()))})
	if err != nil {
		t.Fatal(err)
	}
	if streamed.ExportedCheckpoints != checkpoints {
		t.Errorf("the export's reader compared %d checkpoints, want %d", streamed.ExportedCheckpoints, checkpoints)
	}
}

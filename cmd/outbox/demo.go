package main

import (
	"context"
	"fmt"
	"math/rand/v2"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerline/outbox/migrations"
	"github.com/ledgerline/outbox/pending"
)

func runDemo(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet(env, "demo", "demo [flags]")
	var db dbFlags
	db.register(fs)
	count := fs.Int("instructions", 300, "instructions to enqueue")
	participants := fs.Int("participants", 12, "participants to spread them over")
	logFormat := fs.String("log-format", "text", "log format: text or json")
	if err := parseFlags(fs, env, args); err != nil {
		return err
	}
	log, err := newLogger(env.stderr, *logFormat, "info")
	if err != nil {
		return err
	}
	pool, cleanup, err := db.connect(ctx, log, 8)
	if err != nil {
		return err
	}
	defer cleanup()
	if err := migrations.MigrateWith(ctx, pool, migrations.Options{Schema: db.schema}); err != nil {
		return err
	}
	producer, err := pending.NewProducer(pending.Config{Schema: db.schema})
	if err != nil {
		return err
	}
	run := rand.Uint64()
	var ins []pending.Instruction
	for i := range *count {
		key := pending.DeterministicKey("demo", fmt.Sprint(run), fmt.Sprint(i))
		ins = append(ins, pending.Instruction{
			InstructionID: fmt.Sprintf("demo-%x-%d", run&0xffff, i), ParticipantID: fmt.Sprintf("merchant-%02d", rand.IntN(*participants)),
			IdempotencyKey: key, RailType: "sandbox", AmountMinor: 100 + rand.Int64N(99_900), Currency: "USD",
			Destination: fmt.Sprintf("acct-%06d", rand.IntN(1_000_000)),
		})
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := producer.EnqueueBatch(ctx, tx, ins)
		return err
	}); err != nil {
		return err
	}
	fmt.Fprintf(env.stdout, "enqueued %d instructions\n\n%-14s %8s %10s %10s\n", len(ins), "participant", "pending", "first seq", "last seq")
	rows, err := pool.Query(ctx, migrations.Qualify(db.schema,
		`SELECT participant_id, count(*), min(sequence_id), max(sequence_id) FROM {schema}.pending GROUP BY 1 ORDER BY 1`))
	if err != nil {
		return err
	}
	var p string
	var n, lo, hi int64
	_, err = pgx.ForEachRow(rows, []any{&p, &n, &lo, &hi}, func() error {
		_, err := fmt.Fprintf(env.stdout, "%-14s %8d %10d %10d\n", p, n, lo, hi)
		return err
	})
	return err
}

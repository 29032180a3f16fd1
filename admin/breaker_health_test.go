package admin_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ledgerline/outbox/admin"
	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/rails"
)

// probeTransport fails its first call (the rail is down) and holds every
// later one until release is closed, then accepts it.
type probeTransport struct {
	calls   chan struct{}
	release chan struct{}
	n       int
}

func (p *probeTransport) Send(ctx context.Context, _ payment.Instruction) (rails.Result, error) {
	p.n++ // one call at a time: the breaker lets one probe through
	if p.n == 1 {
		return rails.Result{}, rails.ErrUnavailable
	}
	p.calls <- struct{}{}
	select {
	case <-p.release:
		return rails.Result{Code: "OK"}, nil
	case <-ctx.Done():
		return rails.Result{}, ctx.Err()
	}
}

// TestReadinessOfAHalfOpenBreakerWaitingForWork: a breaker whose open
// period has ended waits, half-open, for the rail's next instruction to
// probe the rail with. Before that probe nothing is known that was not
// known when it opened, and nothing waits on the rail: /readyz is ready
// and says in a note that the breaker waits for a probe. It was degraded
// ("breaker half-open") for as long as no instruction of the rail came,
// hours on a quiet rail, long after the outage. While the probe is in
// flight it is degraded, as while open; a probe that succeeds closes the
// breaker and the note goes. The console's overview says which of the two
// half-open states the breaker is in.
func TestReadinessOfAHalfOpenBreakerWaitingForWork(t *testing.T) {
	t.Parallel()
	tr := &probeTransport{calls: make(chan struct{}, 1), release: make(chan struct{})}
	set, err := rails.NewSet(rails.Options{Type: "psp", Profile: payment.Generic{}, Transport: tr, Timeout: time.Minute,
		Codes: rails.CodeTable{"OK": {Outcome: rails.Dispatched}},
		// Open long enough for the first readyz to see it open on a loaded
		// machine (at 100 ms it was half-open already, once).
		Breaker: rails.BreakerOptions{ConsecutiveFailures: 1, OpenFor: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	b := setup(t, admin.Config{Rails: set})
	ins := payment.Instruction{InstructionID: "i1", ParticipantID: "p1", IdempotencyKey: "k1", RailType: "psp",
		Payment: &payment.Payment{AmountMinor: 100, Currency: "USD", Destination: "acct-1"}}
	readyz := func() admin.Readiness {
		var rd admin.Readiness
		if code := b.call(t, "GET", "/readyz", auditorSecret, nil, &rd); code != 200 {
			t.Fatalf("readyz: %d %+v", code, rd)
		}
		return rd
	}
	if d := set.Execute(b.ctx, ins); d.ErrorCode != rails.CodeRailUnavailable {
		t.Fatalf("first call: %+v", d)
	}
	if rd := readyz(); rd.Status != "degraded" || !slices.Contains(rd.Reasons, "rail psp: breaker open") {
		t.Fatalf("open: %+v", rd)
	}
	for deadline := time.Now().Add(10 * time.Second); set.State("psp") != rails.BreakerHalfOpen; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the breaker never went half-open")
		}
	}
	rd := readyz()
	if rd.Status != "ready" || len(rd.Reasons) != 0 || len(rd.Notes) != 1 || !strings.Contains(rd.Notes[0], "rail psp: breaker half-open, waiting for") {
		t.Fatalf("half-open, no probe: %+v; want ready with a note", rd)
	}
	// The overview says which half-open it is, in the API and on the
	// console's page.
	admin.SetOverviewMaxAge(b.srv, time.Nanosecond)
	probe := func() (admin.RailOverview, string) {
		var ov admin.Overview
		if code := b.call(t, "GET", "/api/v1/overview", auditorSecret, nil, &ov); code != 200 || len(ov.Rails) != 1 {
			t.Fatalf("overview: %d %+v", code, ov)
		}
		return ov.Rails[0], consoleAt(t, b.url).get(t, "/console/")
	}
	if r, page := probe(); r.Breaker != "half-open" || r.ProbeInFlight || !strings.Contains(page, "waiting for an instruction to probe with") {
		t.Fatalf("half-open, no probe: overview %+v, page:\n%s", r, page)
	}
	var public admin.Readiness
	b.call(t, "GET", "/readyz", "", nil, &public)
	if public.Status != "ready" || len(public.Notes) != 1 || strings.Contains(public.Notes[0], "psp") {
		t.Fatalf("half-open, no probe, without a credential: %+v; want ready with a general note", public)
	}

	decision := make(chan rails.Decision, 1)
	go func() { decision <- set.Execute(b.ctx, ins) }()
	<-tr.calls
	if rd := readyz(); rd.Status != "degraded" || !slices.Contains(rd.Reasons, "rail psp: breaker half-open, its probe in flight") {
		t.Fatalf("half-open, probe in flight: %+v", rd)
	}
	if r, page := probe(); r.Breaker != "half-open" || !r.ProbeInFlight || !strings.Contains(page, "its probe in flight") {
		t.Fatalf("half-open, probe in flight: overview %+v, page:\n%s", r, page)
	}
	close(tr.release)
	if d := <-decision; d.Outcome != rails.Dispatched {
		t.Fatalf("probe: %+v", d)
	}
	if rd := readyz(); rd.Status != "ready" || len(rd.Reasons)+len(rd.Notes) != 0 {
		t.Fatalf("closed again: %+v", rd)
	}
}

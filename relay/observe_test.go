package relay

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ledgerline/outbox/engine"
	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/rails"
)

// TestReleasedIsNotAnAttemptError: a stopping relayer hands its unsent
// claims back (RELEASED); they are no failed attempts, and counting them in
// outbox_attempt_errors_total made each restart look like rail errors.
func TestReleasedIsNotAnAttemptError(t *testing.T) {
	t.Parallel()
	m := &Metrics{
		latency:  prometheus.NewHistogram(prometheus.HistogramOpts{Name: "latency"}),
		railTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "rail_time"}, []string{"rail"}),
		errors:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "errors"}, []string{"rail", "error_code"}),
	}
	outcome := func(code rails.ErrorCode) engine.Recorded {
		return engine.Recorded{Outcome: store.Outcome{Identity: store.Identity{RailType: "sandbox"},
			State: store.Retryable, ErrorCode: string(code)}}
	}
	m.observe([]engine.Recorded{outcome(rails.CodeReleased), outcome(rails.CodeReleased), outcome(rails.CodeRailTimeout)})
	reg := prometheus.NewRegistry()
	reg.MustRegister(m.errors)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counted := map[string]float64{}
	for _, f := range families {
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "error_code" {
					counted[l.GetValue()] += s.GetCounter().GetValue()
				}
			}
		}
	}
	if len(counted) != 1 || counted[string(rails.CodeRailTimeout)] != 1 {
		t.Errorf("attempt errors counted %v, want RAIL_TIMEOUT once only", counted)
	}
}

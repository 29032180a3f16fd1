package admin_test

import (
	"strings"
	"testing"

	"github.com/ledgerline/outbox/admin"
	"github.com/ledgerline/outbox/internal/store"
)

// TestParticipantHeldByAPausedRail: a participant whose next instruction
// is due on a paused rail is not "waiting for a relayer to claim it" (no
// relayer will, until the resume): the API's and the console's
// participant view say the pause holds it, and who paused the rail and
// why; the instructions page marks the held instructions.
func TestParticipantHeldByAPausedRail(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	b.enqueue(t, "p1", "k1")
	if _, err := b.st.PauseRail(b.ctx, b.pool, "sandbox", "olga", "bank maintenance"); err != nil {
		t.Fatal(err)
	}
	var v store.ParticipantView
	if code := b.call(t, "GET", "/api/v1/participants/p1", auditorSecret, nil, &v); code != 200 {
		t.Fatalf("participant: %d", code)
	}
	const held = "held by the pause of rail sandbox (by olga: bank maintenance)"
	if strings.Contains(v.Reason, "waiting for a relayer") || !strings.Contains(v.Reason, held) {
		t.Errorf("the API's participant view of a head due on a paused rail: %q", v.Reason)
	}
	c := consoleAt(t, b.url)
	if page := c.get(t, "/console/participant?id=p1"); strings.Contains(page, "waiting for a relayer") || !strings.Contains(page, held) {
		t.Errorf("the console's participant view of a head due on a paused rail:\n%s", page)
	}
	if page := c.get(t, "/console/instructions"); !strings.Contains(page, `class="badge paused-rail"`) {
		t.Errorf("the instructions page does not mark an instruction held by a pause:\n%s", page)
	}

	// Every rail paused holds it too; resumed, it waits for a relayer.
	if _, err := b.st.PauseRail(b.ctx, b.pool, "*", "ivan", "restore"); err != nil {
		t.Fatal(err)
	}
	b.call(t, "GET", "/api/v1/participants/p1", auditorSecret, nil, &v)
	if !strings.Contains(v.Reason, held) || !strings.Contains(v.Reason, "every rail is paused too (by ivan: restore)") {
		t.Errorf("a head due on a rail paused both by itself and with every rail names only one pause: %q", v.Reason)
	}
	if _, err := b.st.ResumeRail(b.ctx, b.pool, "sandbox", "olga", "done"); err != nil {
		t.Fatal(err)
	}
	b.call(t, "GET", "/api/v1/participants/p1", auditorSecret, nil, &v)
	if !strings.Contains(v.Reason, "held by the pause of every rail (by ivan: restore)") {
		t.Errorf("a head due while every rail is paused: %q", v.Reason)
	}
	if _, err := b.st.ResumeRail(b.ctx, b.pool, "*", "ivan", "done"); err != nil {
		t.Fatal(err)
	}
	b.call(t, "GET", "/api/v1/participants/p1", auditorSecret, nil, &v)
	if !strings.Contains(v.Reason, "waiting for a relayer") || strings.Contains(v.Reason, "pause") {
		t.Errorf("a head due after the resume: %q", v.Reason)
	}
	if page := c.get(t, "/console/instructions"); strings.Contains(page, `class="badge paused-rail"`) {
		t.Errorf("the instructions page marks an instruction held after the resume:\n%s", page)
	}
}

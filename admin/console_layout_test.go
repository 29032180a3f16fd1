package admin_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/admin"
	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/pending"
)

// longIDs makes dead letters and pending instructions with ids as long as
// a producer's real ones (UUID instruction ids, long participant ids) and
// returns them.
func (b *bundle) longIDs(t *testing.T) []string {
	t.Helper()
	var ids []string
	for i, p := range []string{"acme-payroll-eu-west-000017", "globex-treasury-settlements", "initech-payables-us-east-4"} {
		r, err := b.producer.Enqueue(b.ctx, b.pool, pending.Instruction{
			InstructionID: uuid.Must(uuid.NewV4()).String(), ParticipantID: p, IdempotencyKey: fmt.Sprintf("k%d", i),
			RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1",
		})
		if err != nil {
			t.Fatal(err)
		}
		if i < 2 { // two dead letters, one pending
			b.record(t, b.claim(t, "r1", time.Hour), store.Failed, "RAIL_REJECTED", 0)
		}
		var instruction string
		if err := b.pool.QueryRow(b.ctx, `SELECT instruction_id FROM outbox.idempotency_keys WHERE outbox_id = $1`, r.OutboxID).Scan(&instruction); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, p, instruction)
	}
	return ids
}

// signedIn is a headless Chromium signed in to b's console as secret.
func (b *bundle) signedIn(t *testing.T, bin, secret string) context.Context {
	t.Helper()
	ctx := browser(t, bin)
	if err := do(ctx, chromedp.Navigate(b.url+"/console/"), waitVisible("#token"), sendKeys("#token", secret),
		submit("#token"), waitVisible(".tiles")); err != nil {
		t.Fatal(err)
	}
	return ctx
}

// deadLetterForm is what an operator sees of one of a dead letter's two
// forms.
type deadLetterForm struct {
	Label, Legend, Placeholder, Button string
	LabelShown                         bool
	Background, Border                 string
	Top, Bottom                        float64
}

// TestDeadLetterFormsDiffer: a dead letter's replay form (the payment is
// sent again) and its acknowledge form (it is settled, nothing is sent)
// must not be taken for one another, else an operator types an
// acknowledgement's reason into the replay form and pays: each has a
// visible heading and a label for its reason that name its action, its own
// placeholder and button wording, its own colours, and space between them.
// They are folded until opened, so that a row is not as tall as both
// forms: folded, each is one line that names its action in its colours.
func TestDeadLetterFormsDiffer(t *testing.T) {
	t.Parallel()
	bin := chromium(t)
	b := setup(t, admin.Config{})
	b.longIDs(t)
	ctx := b.signedIn(t, bin, operatorSecret)
	if err := do(ctx, chromedp.EmulateViewport(1280, 900), chromedp.Navigate(b.url+"/console/dead-letters"), waitVisible("table.dead")); err != nil {
		t.Fatal(err)
	}
	// Folded: each row is short, its two actions one line each that name
	// their action and look unlike; opening one shows its form only.
	for _, width := range []int64{1280, 800} {
		if err := do(ctx, chromedp.EmulateViewport(width, 900), chromedp.Navigate(b.url+"/console/dead-letters"), waitVisible("table.dead")); err != nil {
			t.Fatal(err)
		}
		folded, err := run(ctx, chromedp.Evaluate[map[string]any](`(() => {
		  const row = document.querySelector("table.dead tbody tr");
		  const shown = el => !!el && el.checkVisibility() && el.getBoundingClientRect().height > 0;
		  const toggle = action => row.querySelector('details[class~="act-' + action + '"] > summary');
		  const re = toggle("replay"), ack = toggle("ack");
		  const out = {height: row.getBoundingClientRect().height,
		    replayForm: shown(row.querySelector('form[action$="/replay"] input[name="reason"]')),
		    ackForm: shown(row.querySelector('form[action$="/acknowledge"] input[name="reason"]')),
		    replay: re ? re.innerText : "", ack: ack ? ack.innerText : "",
		    alike: !!re && !!ack && getComputedStyle(re).backgroundColor === getComputedStyle(ack).backgroundColor};
		  if (re) re.click();
		  out.openedReplay = shown(row.querySelector('form[action$="/replay"] input[name="reason"]'));
		  out.openedAck = shown(row.querySelector('form[action$="/acknowledge"] input[name="reason"]'));
		  return out;
		})()`))
		if err != nil {
			t.Fatal(err)
		}
		if h, _ := folded["height"].(float64); h > 80 {
			t.Errorf("at %d px a dead letter's row is %.0f px tall with its forms folded, want at most 80: %v", width, h, folded)
		}
		if folded["replayForm"] == true || folded["ackForm"] == true {
			t.Errorf("at %d px the forms show before they are opened: %v", width, folded)
		}
		re, _ := folded["replay"].(string)
		ack, _ := folded["ack"].(string)
		if !strings.HasPrefix(strings.ToLower(re), "replay") || !strings.HasPrefix(strings.ToLower(ack), "acknowledge") || folded["alike"] == true {
			t.Errorf("at %d px the folded actions do not name their action or look alike: %v", width, folded)
		}
		if folded["openedReplay"] != true || folded["openedAck"] == true {
			t.Errorf("at %d px opening the replay shows not its form alone: %v", width, folded)
		}
	}
	// Both opened.
	if err := do(ctx, chromedp.EmulateViewport(1280, 900), chromedp.Navigate(b.url+"/console/dead-letters"), waitVisible("table.dead")); err != nil {
		t.Fatal(err)
	}
	if _, err := run(ctx, chromedp.Evaluate[bool](`(() => { const row = document.querySelector("table.dead tbody tr");
	  row.querySelectorAll("details").forEach(d => d.open = true); return true; })()`)); err != nil {
		t.Fatal(err)
	}
	forms, err := run(ctx, chromedp.Evaluate[map[string]deadLetterForm](`(() => {
	  const row = document.querySelector("table.dead tbody tr");
	  const info = action => {
	    const form = row.querySelector('form[action$="/' + action + '"]');
	    const input = form.querySelector('input[name="reason"]');
	    const label = input.labels[0], legend = form.querySelector("legend"), box = form.querySelector("fieldset") || form;
	    const st = getComputedStyle(box), r = form.getBoundingClientRect();
	    return {Label: label ? label.innerText : "", LabelShown: !!label && label.getBoundingClientRect().height > 0,
	      Legend: legend ? legend.innerText : "", Placeholder: input.placeholder, Button: form.querySelector("button").innerText,
	      Background: st.backgroundColor, Border: st.borderLeftColor, Top: r.top, Bottom: r.bottom};
	  };
	  return {replay: info("replay"), acknowledge: info("acknowledge")};
	})()`))
	if err != nil {
		t.Fatal(err)
	}
	re, ack := forms["replay"], forms["acknowledge"]
	names := func(s, want, not string) bool {
		s = strings.ToLower(s)
		return strings.Contains(s, want) && !strings.Contains(s, not)
	}
	if !re.LabelShown || !names(re.Label, "replay", "acknowledg") || !ack.LabelShown || !names(ack.Label, "acknowledg", "replay") {
		t.Errorf("the reasons' labels do not name their action: replay %q (shown %v), acknowledge %q (shown %v)", re.Label, re.LabelShown, ack.Label, ack.LabelShown)
	}
	if !names(re.Legend, "replay", "acknowledg") || !names(ack.Legend, "acknowledg", "replay") {
		t.Errorf("the forms' headings do not name their action: replay %q, acknowledge %q", re.Legend, ack.Legend)
	}
	if re.Placeholder == ack.Placeholder {
		t.Errorf("the two reasons have the same placeholder %q", re.Placeholder)
	}
	if !names(re.Button, "replay", "acknowledg") || !names(ack.Button, "acknowledg", "replay") || re.Button == "Replay" || ack.Button == "Acknowledge" {
		t.Errorf("the buttons do not say what they do beyond their action's name: %q, %q", re.Button, ack.Button)
	}
	if re.Background == ack.Background && re.Border == ack.Border {
		t.Errorf("the two forms look alike: background %s, border %s", re.Background, re.Border)
	}
	if gap := ack.Top - re.Bottom; gap < 12 {
		t.Errorf("the acknowledge form is %.0f px below the replay form, want at least 12", gap)
	}
}

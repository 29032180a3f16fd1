package admin_test

import (
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/ledgerline/outbox/admin"
)

// TestIDsStayWhole: in the console's tables an id (an instruction's UUID,
// a participant id) is on one line, not broken at its hyphens, so that it
// reads and copies as one; at 1280 and at 800 pixels wide, where a wide
// table scrolls in its own box rather than pushing the page (and its
// header) sideways.
func TestIDsStayWhole(t *testing.T) {
	t.Parallel()
	bin := chromium(t)
	b := setup(t, admin.Config{})
	ids := b.longIDs(t)
	ctx := b.signedIn(t, bin, operatorSecret)
	// lines is how many lines each of ids takes where the page shows it
	// in a table cell (0: not shown).
	const lines = `ids => ids.map(id => {
	  let n = 0;
	  for (const el of document.querySelectorAll("td, td *")) {
	    if ([...el.childNodes].some(c => c.nodeType === 3 && c.textContent.includes(id))) {
	      const r = document.createRange();
	      r.selectNodeContents(el);
	      const tops = new Set([...r.getClientRects()].filter(x => x.width > 0).map(x => Math.round(x.top)));
	      n = Math.max(n, tops.size);
	    }
	  }
	  return n;
	})`
	for _, width := range []int64{1280, 800} {
		for _, path := range []string{"/console/dead-letters", "/console/instructions?state=pending"} {
			if err := do(ctx, chromedp.EmulateViewport(width, 900), chromedp.Navigate(b.url+path), waitVisible("table")); err != nil {
				t.Fatal(err)
			}
			shown := ids[:4] // the dead letters'
			if strings.HasPrefix(path, "/console/instructions") {
				shown = ids[4:]
			}
			args := `["` + strings.Join(shown, `","`) + `"]`
			got, err := run(ctx, chromedp.Evaluate[[]int](`(`+lines+`)(`+args+`)`))
			if err != nil {
				t.Fatal(err)
			}
			for i, n := range got {
				if n != 1 {
					t.Errorf("%s at %d px: %s takes %d lines", path, width, shown[i], n)
				}
			}
			over, err := run(ctx, chromedp.Evaluate[int](`document.documentElement.scrollWidth - window.innerWidth`))
			if err != nil {
				t.Fatal(err)
			}
			if over > 0 {
				t.Errorf("%s at %d px: the page is %d px wider than the window", path, width, over)
			}
		}
	}
}

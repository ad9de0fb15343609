package web_test

import (
	"context"
	"html"
	"net/http"
	"strings"
	"testing"

	"github.com/stepwise-run/stepwise/cmd/internal/web"
	"github.com/stepwise-run/stepwise/runner/ops"
)

// TestWhyItFailedReadsAsASentence: the run page's "Why it failed" gives
// the run's error as a sentence (capital, full stop) without the Go
// package prefixes the recorded error carries; the runs list drops them
// too.
func TestWhyItFailedReadsAsASentence(t *testing.T) {
	st, _ := failedSettle(t)
	runID := "settle/" + testDate
	info, err := st.Run(context.Background(), runID)
	if err != nil {
		t.Fatal(err)
	}
	recorded := info.Run.Error
	if !strings.Contains(recorded, "steps: ") && !strings.Contains(recorded, "checkpoint: ") {
		t.Fatalf("the recorded error %q has no package prefix: the test shows nothing", recorded)
	}
	srv := serve(t, web.Config{Store: st})
	res, body := get(t, srv, "/runs/"+runID)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET the run page: %s", res.Status)
	}
	seen := html.UnescapeString(text(body))
	want := "Why it failed: " + ops.Sentence(recorded)
	if !strings.Contains(seen, strings.Join(strings.Fields(want), " ")) {
		t.Errorf("the run page lacks %q:\n%s", want, seen)
	}
	_, list := get(t, srv, "/")
	for _, page := range []string{seen, html.UnescapeString(text(list))} {
		if strings.Contains(page, "steps: ") || strings.Contains(page, "checkpoint: ") {
			t.Errorf("a page shows a Go package prefix:\n%s", page)
		}
	}
}

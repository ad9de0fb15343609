package web_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint/checkpointtest"
	"github.com/stepwise-run/stepwise/cmd/internal/web"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/runner/ops"
	"github.com/stepwise-run/stepwise/steps"
)

type lostParams struct {
	Key string `param:"key,key"`
}

// The run page offers a call of unknown outcome for resolve, then, once
// resolved, its resolution for replacing, with the replace box; the
// force box says what forcing a reset of a made call means.
func TestRunPageOffersResolveAndReplace(t *testing.T) {
	ctx := context.Background()
	st, _ := checkpointtest.OpenNew(t)
	var reg jobs.Registry
	reg.MustRegister(jobs.Define("lost", func(ctx context.Context, run *steps.Run, p lostParams) error {
		_, err := steps.Call(ctx, run, "pay", func(ctx context.Context, key string) (int64, error) {
			return 0, steps.OutcomeUnknown(errors.New("the answer was lost"))
		})
		return err
	}))
	r, err := runner.New(runner.Config{Store: st, Jobs: &reg})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Run(ctx, runner.Request{Job: "lost", Values: map[string]string{"key": "k"}}); err == nil {
		t.Fatal("the lost call's run succeeded; want it stopped for a decision")
	}
	srv := serve(t, web.Config{Store: st})
	res, body := get(t, srv, "/runs/lost/k")
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET the run page: %s\n%s", res.Status, body)
	}
	wantIn(t, "run page of an unknown outcome", body, `<select id="op-call" name="call"><option>pay</option>`, `name="replace"`)

	if _, err := ops.Resolve(ctx, st, ops.Who{Operator: "alice", Reason: "seen"}, "lost/k", "pay", true, false, []byte("1200"), time.Now()); err != nil {
		t.Fatal(err)
	}
	_, body = get(t, srv, "/runs/lost/k")
	wantIn(t, "run page of a resolved call", body, `<option value="pay" data-resolved>pay (resolved: replace its resolution)</option>`)
	if strings.Contains(body, "(no step awaits a decision)") {
		t.Errorf("the run page says no step awaits a decision while a resolution can be replaced")
	}
	_, js := get(t, srv, "/static/app.js")
	wantIn(t, "app.js", js, "replace: f.replace.checked", "its outside call was made")
}

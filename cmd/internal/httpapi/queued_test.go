package httpapi_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/cmd/internal/httpapi"
	"github.com/stepwise-run/stepwise/runner"
)

// With workers (serve --enqueue) a start queues the run and answers at
// once: 201 for the request that queued it, 200 for the same start again,
// 422 for the run key with other parameters; nothing runs in the server.
func TestQueuedStarterQueuesRuns(t *testing.T) {
	var queued *httpapi.Queued
	a := newAPI(t, func(c *httpapi.Config) {
		r, err := runner.New(runner.Config{Store: c.Store, Jobs: c.Jobs})
		if err != nil {
			t.Fatal(err)
		}
		queued = &httpapi.Queued{Runner: r, Local: httpapi.NewLocal(r), Queue: "nightly"}
		c.Starter = queued
	})
	got := a.do("POST", "/api/v1/runs", operateToken, start("report", "2026-11-28"))
	expect(t, "first start", got, http.StatusCreated)
	if got.str("status") != checkpoint.RunQueued || got.Body["created"] != true {
		t.Fatalf("first start answered %s; want a queued run, created", got.Raw)
	}
	again := a.do("POST", "/api/v1/runs", operateToken, start("report", "2026-11-28"))
	expect(t, "the same start again", again, http.StatusOK)
	if again.str("status") != checkpoint.RunQueued || again.Body["created"] != false {
		t.Fatalf("the same start again answered %s; want the queued run, not created", again.Raw)
	}
	other := a.do("POST", "/api/v1/runs", operateToken, start("report", "2026-11-28", "note", "x"))
	expect(t, "the run key with other params", other, http.StatusUnprocessableEntity, "params_mismatch", "params")
	info, err := a.st.Run(context.Background(), "report/2026-11-28")
	if err != nil {
		t.Fatal(err)
	}
	if info.Run.Status != checkpoint.RunQueued || info.Run.Queue != "nightly" || len(info.Attempts) != 0 {
		t.Fatalf("the run is %s in queue %q with %d attempts; want queued in nightly with none (the workers run it)",
			info.Run.Status, info.Run.Queue, len(info.Attempts))
	}
}

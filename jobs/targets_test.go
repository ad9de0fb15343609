package jobs_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/steps"
)

type targetParams struct {
	Day    string `param:"day,key"`
	Ledger string `param:"ledger" format:"database"`
	Note   string `param:"note"`
}

func newTargets(t *testing.T, m map[string]string) *jobs.Targets {
	t.Helper()
	ts, err := jobs.NewTargets(m)
	if err != nil {
		t.Fatal(err)
	}
	return ts
}

// A request's resource parameters become target references; the rest
// pass as they are; anything else is refused before Decode.
func TestRequestValues(t *testing.T) {
	job := jobs.Define("tj", noop[targetParams])
	ts := newTargets(t, map[string]string{"ledger": "postgres://app:pw@db.internal/ledger", "archive": "/srv/archive.db"})
	got, err := jobs.RequestValues(job, map[string]string{"day": "d1", "ledger": "archive", "note": "../free/text"}, ts)
	if err != nil || got["ledger"] != "target:archive" || got["note"] != "../free/text" || got["day"] != "d1" {
		t.Fatalf("RequestValues = %v, %v; want ledger target:archive and the rest as given", got, err)
	}
	if got, err := jobs.RequestValues(job, map[string]string{"day": "d1", "ledger": ""}, ts); err != nil || got["ledger"] != "" {
		t.Fatalf("an empty ledger: %v, %v; want it left empty (not given)", got, err)
	}
	for _, v := range []string{"/srv/archive.db", "../archive", "postgres://db.internal/ledger", "dbname=x host=h", "nope", "target:nope"} {
		_, err := jobs.RequestValues(job, map[string]string{"day": "d1", "ledger": v}, ts)
		var pe *jobs.ParamError
		if !errors.As(err, &pe) || pe.Param != "ledger" || !errors.Is(err, jobs.ErrBadParams) || !strings.Contains(err.Error(), "archive, ledger") {
			t.Errorf("ledger=%q: %v; want a ParamError about ledger naming the configured targets", v, err)
		}
		if err != nil && strings.Contains(err.Error(), "pw") {
			t.Errorf("ledger=%q: the error shows a target's password: %v", v, err)
		}
	}
	_, err = jobs.RequestValues(job, map[string]string{"day": "d1", "ledger": "nope"}, nil)
	if !errors.Is(err, jobs.ErrUnknownTarget) || !strings.Contains(err.Error(), "none are configured") {
		t.Errorf("no targets configured: %v; want ErrUnknownTarget saying none are", err)
	}
}

// A stored reference decodes to itself (the same run, the same hash) and
// resolves when the job executes: to the location its context's Targets
// give, or an *UnknownTargetError before the job runs. The job's error
// names the target, not its location.
func TestTargetReferenceResolvesAtExecute(t *testing.T) {
	var saw string
	job := jobs.Define("tj", func(ctx context.Context, run *steps.Run, p targetParams) error {
		saw = p.Ledger
		return fmt.Errorf("open %s: connection refused", "/srv/serve/ledger.db")
	})
	dec, err := job.Decode(map[string]string{"day": "d1", "ledger": "target:ledger"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	again, err := job.Decode(nil, dec.JSON)
	if err != nil || again.Hash != dec.Hash || !strings.Contains(string(dec.JSON), `"ledger":"target:ledger"`) {
		t.Fatalf("stored %s decodes to %s (%v); want itself", dec.JSON, again.JSON, err)
	}
	if _, err := job.Decode(map[string]string{"day": "d1", "ledger": "target:../x"}, nil); !errors.Is(err, jobs.ErrBadParams) {
		t.Errorf("target:../x decodes: %v; want ErrBadParams", err)
	}

	err = job.Execute(context.Background(), nil, dec.JSON)
	var ue *jobs.UnknownTargetError
	if !errors.As(err, &ue) || ue.Name != "ledger" || saw != "" {
		t.Fatalf("Execute without targets: %v (the job saw %q); want an UnknownTargetError before the job runs", err, saw)
	}
	ctx := jobs.WithTargets(context.Background(), newTargets(t, map[string]string{"ledger": "/srv/serve/ledger.db"}))
	err = job.Execute(ctx, nil, dec.JSON)
	if saw != "/srv/serve/ledger.db" {
		t.Fatalf("the job saw ledger %q; want the location", saw)
	}
	var tf *jobs.TargetFailedError
	if !errors.As(err, &tf) || err.Error() != `open target "ledger": connection refused` {
		t.Errorf("the job's error reads %q; want it to name the target, not the path", err)
	}
}

func TestNewTargetsRefusesBadTargets(t *testing.T) {
	for _, m := range []map[string]string{
		{"Ledger": "/srv/l.db"},
		{"a.b": "/srv/l.db"},
		{"ledger": "relative.db"},
		{"ledger": "postgres://host-only"},
		{"ledger": "mysql://h/db"},
	} {
		if _, err := jobs.NewTargets(m); err == nil {
			t.Errorf("NewTargets(%v) accepted it", m)
		}
	}
}

package checkpoint_test

import (
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// TestClaimRequestsValidate: the one check both stores run before a claim
// touches the database.
func TestClaimRequestsValidate(t *testing.T) {
	now := time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC)
	ok := checkpoint.ClaimRequest{RunID: "settle/2026-11-28", Owner: "h:1", Now: now, LeaseFor: time.Minute}
	if err := ok.Validate(true); err != nil {
		t.Errorf("a full request: %v", err)
	}
	noNow := ok
	noNow.Now = time.Time{}
	if err := noNow.Validate(false); err != nil {
		t.Errorf("no Now on the store's own clock: %v; want accepted", err)
	}
	for name, mod := range map[string]func(*checkpoint.ClaimRequest){
		"no run ID":      func(r *checkpoint.ClaimRequest) { r.RunID = "" },
		"no owner":       func(r *checkpoint.ClaimRequest) { r.Owner = "" },
		"no time":        func(r *checkpoint.ClaimRequest) { r.Now = time.Time{} },
		"negative lease": func(r *checkpoint.ClaimRequest) { r.LeaseFor = -time.Second },
	} {
		r := ok
		mod(&r)
		if err := r.Validate(true); err == nil {
			t.Errorf("claim with %s accepted", name)
		}
	}
	s := checkpoint.ScheduleClaimRequest{Name: "nightly", Owner: "h:1", Now: now, LeaseFor: time.Minute}
	if err := s.Validate(); err != nil {
		t.Errorf("a full schedule claim: %v", err)
	}
	for name, mod := range map[string]func(*checkpoint.ScheduleClaimRequest){
		"no name":  func(r *checkpoint.ScheduleClaimRequest) { r.Name = "" },
		"no owner": func(r *checkpoint.ScheduleClaimRequest) { r.Owner = "" },
		"no time":  func(r *checkpoint.ScheduleClaimRequest) { r.Now = time.Time{} },
		"no lease": func(r *checkpoint.ScheduleClaimRequest) { r.LeaseFor = 0 },
	} {
		r := s
		mod(&r)
		if err := r.Validate(); err == nil {
			t.Errorf("schedule claim with %s accepted", name)
		}
	}
}

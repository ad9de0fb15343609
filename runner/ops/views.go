package ops

import (
	"context"
	"encoding/json"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/runner"
)

// RunView is the JSON shape of a run in `runs --json`, `show --json` and
// the HTTP API.
type RunView struct {
	ID         string          `json:"id"`
	Job        string          `json:"job"`
	RunKey     string          `json:"run_key"`
	Status     string          `json:"status"`
	Stale      bool            `json:"stale"`
	Params     json.RawMessage `json:"params"`
	Fence      int64           `json:"fence"`
	LeaseOwner string          `json:"lease_owner,omitempty"`
	LeaseUntil *time.Time      `json:"lease_until,omitempty"`
	Error      string          `json:"error,omitempty"`
	CreatedAt  time.Time       `json:"created_at"`
	UpdatedAt  time.Time       `json:"updated_at"`
	FinishedAt *time.Time      `json:"finished_at,omitempty"`
	// Queue, Priority and AvailableAt are set for a run enqueued for
	// workers; Limit and LimitMax for a run under a concurrency limit.
	Queue       string     `json:"queue,omitempty"`
	Priority    int        `json:"priority,omitempty"`
	AvailableAt *time.Time `json:"available_at,omitempty"`
	Limit       string     `json:"limit,omitempty"`
	LimitMax    int        `json:"limit_max,omitempty"`
	// NextTry is when a worker takes a queued or interrupted run of a
	// queue again, once its not-before passes (a run the pool tries
	// again after a store fault, with backoff); nil when it is due now
	// or not queued.
	NextTry *time.Time `json:"next_try,omitempty"`
}

// NextTry is when a worker takes r again, on the store's clock at now:
// the zero time unless r is a queued or interrupted run of a queue whose
// not-before is still ahead.
func NextTry(r checkpoint.Run, now time.Time) time.Time {
	if r.Queue == "" || (r.Status != checkpoint.RunQueued && r.Status != checkpoint.RunInterrupted) || !r.AvailableAt.After(now) {
		return time.Time{}
	}
	return r.AvailableAt
}

// ViewRun is r as operators see it at now.
func ViewRun(r checkpoint.Run, now time.Time) RunView {
	return RunView{
		ID: r.ID, Job: r.Job, RunKey: r.RunKey, Status: r.Status, Stale: Stale(r, now), Params: r.Params,
		Fence: r.Fence, LeaseOwner: r.LeaseOwner, LeaseUntil: OptTime(r.LeaseUntil), Error: r.Error,
		CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, FinishedAt: OptTime(r.FinishedAt),
		Queue: r.Queue, Priority: r.Priority, AvailableAt: OptTime(r.AvailableAt), Limit: r.Limit.Key, LimitMax: r.Limit.Max,
		NextTry: OptTime(NextTry(r, now)),
	}
}

// OptTime is t for JSON: nil when zero, so the field is left out.
func OptTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// Stale reports whether a run is left running by a runner that is gone:
// its lease expired, or its owner's process surely exited (then run and
// resume take it over at once).
func Stale(r checkpoint.Run, now time.Time) bool {
	return r.Stale(now) || (r.Status == checkpoint.RunRunning && runner.OwnerGone(r.LeaseOwner))
}

// MessageView is an outbox message; its payload, JSON, is shown as JSON.
type MessageView struct {
	Key       string          `json:"key"`
	Topic     string          `json:"topic"`
	Payload   json.RawMessage `json:"payload"`
	Status    string          `json:"status"`
	Tries     int             `json:"tries"`
	NextAt    time.Time       `json:"next_at"`
	LastError string          `json:"last_error,omitempty"`
	CreatedAt time.Time       `json:"created_at"`
	SentAt    *time.Time      `json:"sent_at,omitempty"`
}

// ViewMessage is m as operators see it.
func ViewMessage(m checkpoint.Message) MessageView {
	payload := json.RawMessage(m.Payload)
	if !json.Valid(m.Payload) { // not written by steps.Notify: shown as a string
		payload, _ = json.Marshal(string(m.Payload))
	}
	return MessageView{Key: m.Key, Topic: m.Topic, Payload: payload, Status: m.Status, Tries: m.Tries, NextAt: m.NextAt,
		LastError: m.LastError, CreatedAt: m.CreatedAt, SentAt: OptTime(m.SentAt)}
}

// Now is the time operators' views are judged at: the store's clock
// (checkpoint.Inspector.StoreNow, PostgreSQL's now()) when it keeps one,
// so a host whose clock is skewed sees a live run as live; else local,
// the caller's clock. If the store cannot be read, local: the listing
// that follows reports the store's error.
func Now(ctx context.Context, st checkpoint.Backend, local time.Time) time.Time {
	if now, err := st.StoreNow(ctx); err == nil && !now.IsZero() {
		return now
	}
	return local
}

package ops

import (
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
}

// ViewRun is r as operators see it at now.
func ViewRun(r checkpoint.Run, now time.Time) RunView {
	return RunView{
		ID: r.ID, Job: r.Job, RunKey: r.RunKey, Status: r.Status, Stale: Stale(r, now), Params: r.Params,
		Fence: r.Fence, LeaseOwner: r.LeaseOwner, LeaseUntil: OptTime(r.LeaseUntil), Error: r.Error,
		CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, FinishedAt: OptTime(r.FinishedAt),
		Queue: r.Queue, Priority: r.Priority, AvailableAt: OptTime(r.AvailableAt), Limit: r.Limit.Key, LimitMax: r.Limit.Max,
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

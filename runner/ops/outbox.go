package ops

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// DeadLetters selects the dead outbox messages RequeueDead sends again:
// exactly one of Keys, RunID and All.
type DeadLetters struct {
	// Keys are messages by exact key ("RUN_ID/STEP_ID", as listed).
	Keys []string
	// RunID selects every dead message of one run.
	RunID string
	// All selects every dead message in the outbox.
	All bool
}

// RequeueDead queues dead messages again after their receiver was fixed:
// due at now, no tries counted, so the next dispatcher delivers each
// (once per its window, with its key as before). Only dead messages
// change; named ones that are queued or sent are left as they are and
// returned in NotDead. It is recorded in the audit trail of every run
// whose messages it queued, and needs a reason (ErrNeedsReason). An
// unknown key is a *checkpoint.UnknownMessagesError and nothing changes;
// an unknown run is checkpoint.ErrNotFound.
func RequeueDead(ctx context.Context, st checkpoint.Backend, who Who, sel DeadLetters, now time.Time) (checkpoint.RequeueResult, checkpoint.Audit, error) {
	a := who.Audit("", "outbox requeue", "", now)
	if err := who.Check(); err != nil {
		return checkpoint.RequeueResult{}, a, err
	}
	if strings.TrimSpace(who.Reason) == "" {
		return checkpoint.RequeueResult{}, a, fmt.Errorf("%w: requeuing dead messages sends them again; say why (what was fixed), for the audit trail", ErrNeedsReason)
	}
	if sel.RunID != "" && len(sel.Keys) == 0 && !sel.All {
		if _, err := st.Run(ctx, sel.RunID); err != nil {
			return checkpoint.RequeueResult{}, a, err
		}
	}
	res, err := st.RequeueDead(ctx, checkpoint.Requeue{Keys: sel.Keys, RunID: sel.RunID, All: sel.All, Now: now, Audit: a})
	return res, a, err
}

// OutboxView is a message as `outbox --json` and GET /api/v1/outbox show
// it: show's message with its run.
type OutboxView struct {
	RunID string `json:"run_id"`
	MessageView
}

// ViewOutbox is m as the outbox listings show it.
func ViewOutbox(m checkpoint.Message) OutboxView {
	return OutboxView{RunID: m.RunID, MessageView: ViewMessage(m)}
}

// OutboxQuery selects the messages ListOutbox returns.
type OutboxQuery struct {
	// Status keeps the messages with this status (checkpoint.MessageQueued,
	// MessageSent or MessageDead); every status if empty.
	Status string
	// RunID keeps one run's messages; every run's if empty.
	RunID string
	// Limit is the most messages returned; every one if 0 or less.
	Limit int
}

// ListOutbox returns the outbox's messages q selects, oldest first by
// creation. A run q names that is not recorded is checkpoint.ErrNotFound.
func ListOutbox(ctx context.Context, st checkpoint.Backend, q OutboxQuery) ([]OutboxView, error) {
	var msgs []checkpoint.Message
	if q.RunID == "" {
		var err error
		if msgs, err = st.Messages(ctx, q.Status, q.Limit); err != nil {
			return nil, err
		}
	} else {
		if _, err := st.Run(ctx, q.RunID); err != nil {
			return nil, err
		}
		all, err := st.RunMessages(ctx, q.RunID)
		if err != nil {
			return nil, err
		}
		for _, m := range all {
			if q.Status == "" || m.Status == q.Status {
				msgs = append(msgs, m)
			}
		}
		if q.Limit > 0 && len(msgs) > q.Limit {
			msgs = msgs[:q.Limit]
		}
	}
	views := make([]OutboxView, 0, len(msgs))
	for _, m := range msgs {
		views = append(views, ViewOutbox(m))
	}
	return views, nil
}

// RequeueView is the outcome of RequeueDead as `outbox requeue --json`
// and POST /api/v1/outbox/requeue show it: the messages queued again, the
// named ones left as they were, and the audit record's who, why and when.
type RequeueView struct {
	Operation string       `json:"operation"`
	Requeued  []OutboxView `json:"requeued"`
	NotDead   []OutboxView `json:"not_dead"`
	Operator  string       `json:"operator"`
	Reason    string       `json:"reason"`
	At        time.Time    `json:"at"`
}

// ViewRequeue is the view of what RequeueDead returned; its lists are
// empty, never null, when nothing is in them.
func ViewRequeue(res checkpoint.RequeueResult, a checkpoint.Audit) RequeueView {
	v := RequeueView{Operation: a.Command, Requeued: make([]OutboxView, 0, len(res.Requeued)), NotDead: make([]OutboxView, 0, len(res.NotDead)),
		Operator: a.Operator, Reason: a.Reason, At: a.At}
	for _, m := range res.Requeued {
		v.Requeued = append(v.Requeued, ViewOutbox(m))
	}
	for _, m := range res.NotDead {
		v.NotDead = append(v.NotDead, ViewOutbox(m))
	}
	return v
}

// NotDeadText says why a message RequeueDead was named is left as it is.
func NotDeadText(m checkpoint.Message) string {
	switch m.Status {
	case checkpoint.MessageSent:
		return fmt.Sprintf("%s was sent at %s; it is not dead, so it is not sent again", m.Key, m.SentAt.UTC().Format(time.RFC3339))
	case checkpoint.MessageQueued:
		return fmt.Sprintf("%s is queued, not dead (%s so far); a dispatcher delivers it without a requeue", m.Key, failedTries(m.Tries))
	}
	return fmt.Sprintf("%s is %s, not dead; left as it is", m.Key, m.Status)
}

func failedTries(n int) string {
	if n == 1 {
		return "1 failed try"
	}
	return fmt.Sprintf("%d failed tries", n)
}

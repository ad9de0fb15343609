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

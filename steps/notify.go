package steps

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// Notify queues a notification (a message on topic with a JSON payload) as
// the step id. The message commits in the same transaction as the step's
// checkpoint, so it is queued exactly once per run whatever crashes; a
// dispatcher then delivers it at least once, under the stable key
// RUN_ID/STEP_ID that receivers use to drop duplicates.
func Notify(ctx context.Context, r *Run, id, topic string, payload any, opts ...Option) (err error) {
	ctx, sp := r.startStep(ctx, id, kindNotify)
	defer func() { sp.end(err) }()
	cp, _, done, err := start[string](ctx, r, id, opts, sp)
	if done || err != nil {
		return err
	}
	if topic == "" {
		return fmt.Errorf("steps: notification %s has no topic", id)
	}
	body, err := json.Marshal(payload)
	if err != nil {
		return fmt.Errorf("steps: notification %s: encode payload %T as JSON: %w", id, payload, err)
	}
	key := r.lease.RunID + "/" + id
	cp.Status, cp.FinishedAt = checkpoint.StepCompleted, r.now()
	cp.Output, _ = json.Marshal(key)
	if r.dryRun {
		_, err := finish[string](r, cp)
		return err
	}
	msg := checkpoint.Message{Key: key, Topic: topic, Payload: body, CreatedAt: cp.FinishedAt}
	err = r.runTx(context.WithoutCancel(ctx), func(tx checkpoint.Tx) error {
		if err := tx.PutStep(cp); err != nil {
			return err
		}
		return tx.Enqueue(msg)
	})
	if err != nil {
		return fmt.Errorf("steps: queue notification %s: %w", id, err)
	}
	crashStep(id, "after-checkpoint")
	_, err = finish[string](r, cp)
	return err
}

package runner

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/steps"
)

// Delivery sends outbox messages somewhere. It must be safe to deliver one
// message twice: delivery is at least once, and receivers deduplicate by
// the message's key.
type Delivery interface {
	Deliver(ctx context.Context, m checkpoint.Message) error
}

// envelope is a message as delivered: JSON with its stable key.
type envelope struct {
	Key     string          `json:"key"`
	RunID   string          `json:"run_id"`
	Topic   string          `json:"topic"`
	Payload json.RawMessage `json:"payload"`
}

func envelopeOf(m checkpoint.Message) envelope {
	return envelope{Key: m.Key, RunID: m.RunID, Topic: m.Topic, Payload: m.Payload}
}

// WriterDelivery writes each message as one JSON line to W (stdout, a
// file).
type WriterDelivery struct {
	W  io.Writer
	mu sync.Mutex
}

// Deliver implements Delivery.
func (d *WriterDelivery) Deliver(ctx context.Context, m checkpoint.Message) error {
	b, err := json.Marshal(envelopeOf(m))
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	_, err = d.W.Write(append(b, '\n'))
	return err
}

// FileDelivery appends each message as one JSON line to the file at Path,
// synced before the message counts as delivered.
type FileDelivery struct {
	Path string
}

// Deliver implements Delivery.
func (d FileDelivery) Deliver(ctx context.Context, m checkpoint.Message) error {
	f, err := os.OpenFile(d.Path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	b, err := json.Marshal(envelopeOf(m))
	if err == nil {
		_, err = f.Write(append(b, '\n'))
	}
	if err == nil {
		err = f.Sync()
	}
	return errors.Join(err, f.Close())
}

// WebhookDelivery POSTs each message as JSON to URL with the headers
// Idempotency-Key (the message's key) and X-Stepwise-Topic, and, when
// tracing, traceparent (W3C Trace Context) of the delivery's span. Any 2xx
// answer is a delivery; anything else is retried later.
type WebhookDelivery struct {
	URL string
	// Client defaults to one with a 10s timeout.
	Client *http.Client
}

// Deliver implements Delivery.
func (d WebhookDelivery) Deliver(ctx context.Context, m checkpoint.Message) error {
	b, err := json.Marshal(envelopeOf(m))
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.URL, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", m.Key)
	req.Header.Set("X-Stepwise-Topic", m.Topic)
	steps.InjectTrace(ctx, req.Header) // traceparent of the delivery pass's span, when tracing
	client := d.Client
	if client == nil {
		client = &http.Client{Timeout: 10 * time.Second}
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("webhook %s answered %s", d.URL, resp.Status)
	}
	return nil
}

// ParseDelivery turns a --deliver value into a Delivery: "stdout",
// "file:PATH" or an http(s) URL.
func ParseDelivery(s string, stdout io.Writer) (Delivery, error) {
	switch {
	case s == "stdout":
		return &WriterDelivery{W: stdout}, nil
	case strings.HasPrefix(s, "file:") && len(s) > len("file:"):
		return FileDelivery{Path: strings.TrimPrefix(s, "file:")}, nil
	case strings.HasPrefix(s, "http://") || strings.HasPrefix(s, "https://"):
		return WebhookDelivery{URL: s}, nil
	}
	return nil, fmt.Errorf("delivery target %q: use stdout, file:PATH or an http(s):// URL", s)
}

// Dispatcher defaults.
const (
	// DefaultVisibility is how long a dispatcher's claim hides the
	// messages it took from other dispatchers: room for a batch of
	// deliveries at the webhook's 10s timeout.
	DefaultVisibility = 2 * time.Minute
	// DefaultMaxTries is how many failed deliveries make a message dead.
	DefaultMaxTries = 10
	// DefaultBatch is how many messages one claim takes.
	DefaultBatch = 10
)

// Dispatcher delivers queued outbox messages at least once, retrying failed
// deliveries with backoff, until a message fails MaxTries times and is
// dead.
//
// Any number of dispatchers, in one process or many, may share a store:
// each claims a batch of due messages (checkpoint.OutboxStore's
// ClaimMessages), which hides them from the others for VisibleFor. A
// dispatcher delivers a claimed message only while its claim's window has
// at least a tenth of VisibleFor left, and cancels a delivery at that
// point, so while dispatchers stay alive each message is delivered once;
// one that dies mid-batch leaves its messages to the first claim after the
// window, and they are delivered again with the same key.
type Dispatcher struct {
	// Store holds the outbox. Required.
	Store checkpoint.OutboxStore
	// To delivers the messages. Required.
	To Delivery
	// Clock tells the time. Defaults to SystemClock.
	Clock Clock
	// Backoff spaces the retries of a failed delivery (its Multiplier,
	// Initial, Max and Jitter are used). Defaults to 1s doubling up to 10m.
	Backoff steps.RetryPolicy
	// VisibleFor is the window of a claim (the visibility timeout): how
	// long the messages one claim took stay hidden from other claims.
	// It should exceed a batch's deliveries. Defaults to
	// DefaultVisibility.
	VisibleFor time.Duration
	// MaxTries is how many failed deliveries make a message dead (a dead
	// letter, never claimed again, logged at ERROR). Defaults to
	// DefaultMaxTries.
	MaxTries int
	// Batch is how many messages one claim takes. Defaults to
	// DefaultBatch.
	Batch int
	// Logger receives delivery logs. Defaults to zerolog.Nop().
	Logger zerolog.Logger
}

// PassResult counts what one dispatcher pass did.
type PassResult struct {
	// Sent counts deliveries, Failed failed deliveries to retry later,
	// Dead failed deliveries that made their message dead.
	Sent, Failed, Dead int
	// Left counts claimed messages not delivered because their claim's
	// window ran out (a slow batch): claimable again when it ends.
	Left int
}

// Pass claims and delivers every message due now, once each, and records
// the outcomes.
func (d *Dispatcher) Pass(ctx context.Context) (PassResult, error) {
	var res PassResult
	p, err := d.pass()
	if err != nil {
		return res, err
	}
	for {
		claimedAt := p.clock.Now()
		due, err := d.Store.ClaimMessages(ctx, claimedAt, p.batch, p.window)
		if err != nil || len(due) == 0 {
			return res, err
		}
		stopAt := claimedAt.Add(p.window - p.window/10) // on this dispatcher's clock
		progressed := false
		for _, m := range due {
			if err := ctx.Err(); err != nil {
				return res, err
			}
			sent, err := d.deliver(ctx, p, m, stopAt, &res)
			if err != nil {
				return res, err
			}
			progressed = progressed || sent
		}
		if !progressed || res.Left > 0 {
			return res, nil
		}
	}
}

// passSettings is a Dispatcher's settings with their defaults filled in.
type passSettings struct {
	clock           Clock
	backoff         steps.RetryPolicy
	window          time.Duration
	maxTries, batch int
}

// pass checks the Dispatcher's settings and fills in their defaults.
func (d *Dispatcher) pass() (passSettings, error) {
	if d.Store == nil || d.To == nil {
		return passSettings{}, errors.New("runner: Dispatcher needs a Store and a Delivery")
	}
	if d.VisibleFor < 0 || d.MaxTries < 0 || d.Batch < 0 {
		return passSettings{}, fmt.Errorf("runner: Dispatcher VisibleFor (%s), MaxTries (%d) and Batch (%d) cannot be negative", d.VisibleFor, d.MaxTries, d.Batch)
	}
	p := passSettings{clock: d.Clock, backoff: d.Backoff, window: cmp.Or(d.VisibleFor, DefaultVisibility),
		maxTries: cmp.Or(d.MaxTries, DefaultMaxTries), batch: cmp.Or(d.Batch, DefaultBatch)}
	if p.clock == nil {
		p.clock = SystemClock{}
	}
	if p.backoff.Initial == 0 {
		p.backoff.Initial = time.Second
	}
	if p.backoff.Max == 0 {
		p.backoff.Max = 10 * time.Minute
	}
	return p, nil
}

// deliver delivers one claimed message within its claim's window (up to
// stopAt) and records the outcome in the store and in res; sent is true
// if it was delivered. An error is the store's, or ctx's.
func (d *Dispatcher) deliver(ctx context.Context, p passSettings, m checkpoint.Message, stopAt time.Time, res *PassResult) (sent bool, err error) {
	left := stopAt.Sub(p.clock.Now())
	if left <= 0 {
		res.Left++
		d.Logger.Warn().Str("key", m.Key).Dur("window", p.window).Msg("claim's window ran out before delivery; the message is claimable again when it ends")
		return false, nil
	}
	dctx, cancel := context.WithTimeout(ctx, left)
	derr := d.To.Deliver(dctx, m)
	cut := derr != nil && errors.Is(dctx.Err(), context.DeadlineExceeded)
	cancel()
	now := p.clock.Now()
	if derr == nil {
		if err := d.Store.MarkSent(ctx, m.Key, now); err != nil {
			return false, err
		}
		res.Sent++
		d.Logger.Info().Str("key", m.Key).Str("topic", m.Topic).Int("tries", m.Tries+1).Msg("message delivered")
		return true, nil
	}
	if err := ctx.Err(); err != nil {
		return false, err // stopped, not a failed delivery
	}
	if cut {
		// Our own window ran out, not the receiver's answer: no
		// try is counted (it could make the message dead), and it
		// is claimable again when the window ends.
		res.Left++
		d.Logger.Warn().Str("key", m.Key).Dur("window", p.window).Err(derr).
			Msg("delivery stopped when the claim's window ran out; not counted as a try, claimable again when the window ends")
		return false, nil
	}
	delay := p.backoff.Backoff(m.Tries+1, rand.Float64())
	dead, err := d.Store.MarkFailed(ctx, checkpoint.DeliveryFailure{Key: m.Key, Error: derr.Error(), RetryAt: now.Add(delay), RetryIn: delay, MaxTries: p.maxTries})
	if err != nil {
		return false, err
	}
	if dead {
		res.Dead++
		d.Logger.Error().Str("key", m.Key).Str(steps.FieldRunID, m.RunID).Str("topic", m.Topic).Int("tries", m.Tries+1).Int("max_tries", p.maxTries).Err(derr).
			Msg("delivery failed for the last time; the message is dead and is not retried")
		return false, nil
	}
	res.Failed++
	d.Logger.Warn().Str("key", m.Key).Err(derr).Float64(steps.FieldRetryInSeconds, delay.Seconds()).Msg("delivery failed; will retry")
	return false, nil
}

package cmd

import (
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/runner/ops"
)

// OutboxCmd groups the outbox's commands: listing its messages (the
// default) and requeuing dead ones.
type OutboxCmd struct {
	List    OutboxListCmd    `cmd:"" default:"withargs" help:"List notifications across runs, oldest first: queued, sent or dead (what '${name} outbox' alone does)."`
	Requeue OutboxRequeueCmd `cmd:"" help:"Send dead notifications again, once their receiver is fixed: queued, due now, tries reset; audited."`
}

// OutboxListCmd lists outbox messages across runs, for an operator looking
// for dead letters or a backlog.
type OutboxListCmd struct {
	Status string `placeholder:"STATUS" help:"Only messages with this status: queued, sent or dead; every status if not given."`
	RunID  string `name:"run" placeholder:"RUN_ID" help:"Only the messages of this run (an unknown run is refused, exit 2)."`
	Limit  int    `default:"100" nonzero:"" help:"At most this many messages (at least 1)."`
	JSON   bool   `name:"json" help:"Print JSON instead of a table."`
}

// Run implements the outbox command.
func (c *OutboxListCmd) Run(env *Env) error {
	if err := oneOf("--status", c.Status, []string{"queued", "sent", "dead"}); err != nil {
		return err
	}
	st, err := env.ReadStore()
	if err != nil {
		return err
	}
	msgs, err := ops.ListOutbox(env.Ctx, st, ops.OutboxQuery{Status: c.Status, RunID: c.RunID, Limit: c.Limit})
	if err != nil {
		return err
	}
	if c.JSON {
		return writeJSON(env.Stdout, msgs)
	}
	if len(msgs) == 0 {
		what := "messages"
		if c.Status != "" {
			what = c.Status + " messages"
		}
		if c.RunID != "" {
			what += " of run " + c.RunID
		}
		fmt.Fprintf(env.Stdout, "no %s in the outbox\n", what)
		return nil
	}
	now := env.now()
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NOTIFICATION\tRUN\tTOPIC\tSTATE\tTRIES\tNEXT\tLAST ERROR")
	for _, m := range msgs {
		next := "-"
		if m.Status == checkpoint.MessageQueued {
			next = ago(m.NextAt, now)
			if !m.NextAt.After(now) {
				next = "due"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", m.Key, m.RunID, m.Topic, m.Status, m.Tries, next, preview(m.LastError, 60))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(msgs) == c.Limit {
		fmt.Fprintf(env.Stderr, "note: the first %d shown; raise --limit for more\n", c.Limit)
	}
	return nil
}

// OutboxRequeueCmd queues dead messages again.
type OutboxRequeueCmd struct {
	operatorFlags
	Keys    []string `arg:"" optional:"" name:"key" help:"Dead messages to send again, by key (RUN_ID/STEP_ID, as '${name} outbox --status dead' lists them)."`
	RunID   string   `name:"run" placeholder:"RUN_ID" help:"Send every dead message of this run again, instead of naming keys."`
	AllDead bool     `name:"all-dead" help:"Send every dead message in the outbox again, instead of naming keys."`
	Reason  string   `required:"" help:"What was fixed, for the audit log of each run whose messages are requeued."`
	JSON    bool     `name:"json" help:"Print the outcome as one JSON object (operation, requeued, not_dead, operator, reason, at) instead of lines."`
}

// Help implements kong.HelpProvider: the longer help of outbox requeue.
func (c *OutboxRequeueCmd) Help() string {
	return `A dead message failed --max-tries deliveries and is never tried again by
itself. Once its receiver is fixed, requeue puts it back in the queue: due now,
its tries counted from 0, its last error kept until the next delivery. The next
dispatch (or a running 'dispatch --every') delivers it at least once, with the
same key as before, so a receiver that saw it already drops the duplicate.

Name the messages by key, or take every dead message of one run (--run RUN_ID),
or every dead message there is (--all-dead): exactly one of these. Only dead
messages change, in one transaction, safe while dispatchers run. A key no
message has is refused (exit 2) and nothing is requeued; a named message that is
queued or sent is left as it is and named, and the command exits 5 once the
dead ones it named are requeued. Each run whose messages are requeued records
who (--operator), why (--reason) and the keys in its audit log ('show RUN_ID').

For example:
  outbox --status dead
  outbox requeue settle/2026-11-28/notify --reason "webhook certificate renewed"
  outbox requeue --all-dead --reason "receiver back after the outage"
  dispatch --to https://hooks.example/settled`
}

// selection is the dead messages the flags name, or a usage error.
func (c *OutboxRequeueCmd) selection(name string) (ops.DeadLetters, error) {
	given := 0
	for _, set := range []bool{len(c.Keys) > 0, c.RunID != "", c.AllDead} {
		if set {
			given++
		}
	}
	if given != 1 {
		what := "none"
		if given > 1 {
			what = "more than one"
		}
		return ops.DeadLetters{}, usageError{fmt.Errorf("outbox requeue: name the dead messages with exactly one of KEY..., --run RUN_ID or --all-dead (%s given); "+
			"`%s outbox --status dead` lists them", what, name)}
	}
	if strings.TrimSpace(c.Reason) == "" {
		return ops.DeadLetters{}, usageError{errors.New("outbox requeue: --reason is empty; say what was fixed, for the audit log")}
	}
	return ops.DeadLetters{Keys: c.Keys, RunID: c.RunID, All: c.AllDead}, nil
}

// Run implements the outbox requeue command.
func (c *OutboxRequeueCmd) Run(env *Env) error {
	sel, err := c.selection(env.Name)
	if err != nil {
		return err
	}
	st, err := env.ExistingStore()
	if err != nil {
		return err
	}
	res, a, err := ops.RequeueDead(env.Ctx, st, c.who(c.Reason), sel, env.now())
	if err != nil {
		return err
	}
	var refused error
	if len(res.NotDead) > 0 {
		why := make([]string, 0, len(res.NotDead))
		for _, m := range res.NotDead {
			why = append(why, ops.NotDeadText(m))
		}
		refused = fmt.Errorf("%w: %s; only dead messages are requeued (`%s outbox --status dead` lists them)",
			ErrNeedsDecision, strings.Join(why, "; "), env.Name)
	}
	if c.JSON {
		v := ops.ViewRequeue(res, a)
		if err := writeJSON(env.Stdout, v); err != nil {
			return err
		}
		return refused
	}
	switch {
	case len(res.Requeued) > 0:
		them := "them with their keys"
		if len(res.Requeued) == 1 {
			them = "it with its key"
		}
		fmt.Fprintf(env.Stdout, "requeued %s, due now; the next `%s dispatch` delivers %s:\n",
			plural(len(res.Requeued), "dead message"), env.Name, them)
		tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
		for _, m := range res.Requeued {
			fmt.Fprintf(tw, "  %s\t%s\t%s\n", m.Key, m.Topic, preview("last error: "+m.LastError, 70))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	case c.RunID != "":
		fmt.Fprintf(env.Stdout, "run %s has no dead messages; nothing requeued\n", c.RunID)
	case c.AllDead:
		fmt.Fprintln(env.Stdout, "no dead messages in the outbox; nothing requeued")
	}
	return refused
}

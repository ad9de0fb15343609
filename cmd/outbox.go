package cmd

import (
	"fmt"
	"text/tabwriter"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/ops"
)

// OutboxCmd lists outbox messages across runs, for an operator looking
// for dead letters or a backlog.
type OutboxCmd struct {
	Status string `enum:",queued,sent,dead" default:"" help:"Only messages with this status (queued, sent or dead); every status if empty."`
	Limit  int    `default:"100" nonzero:"" help:"At most this many messages (at least 1)."`
	JSON   bool   `name:"json" help:"Print JSON instead of a table."`
}

// outboxView is a message in `outbox --json`: show's message with its run.
type outboxView struct {
	RunID string `json:"run_id"`
	ops.MessageView
}

// Run implements the outbox command.
func (c *OutboxCmd) Run(env *Env) error {
	st, err := env.ExistingStore()
	if err != nil {
		return err
	}
	msgs, err := st.Messages(env.Ctx, c.Status, c.Limit)
	if err != nil {
		return err
	}
	if c.JSON {
		views := make([]outboxView, 0, len(msgs))
		for _, m := range msgs {
			views = append(views, outboxView{RunID: m.RunID, MessageView: ops.ViewMessage(m)})
		}
		return writeJSON(env.Stdout, views)
	}
	if len(msgs) == 0 {
		what := "messages"
		if c.Status != "" {
			what = c.Status + " messages"
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

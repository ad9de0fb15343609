package cmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/steps"
)

// These tests hold the operator commands to their promise about outside
// calls, through the command line in process on the selected store: a
// call that was made is never cleared (and so made again) without
// --force, and resolve records only an output the job can decode.

// payReceipt is the payop job's call output.
type payReceipt struct {
	ID     string `json:"id"`
	Amount int64  `json:"amount"`
}

type payOpParams struct {
	Key string `param:"key,key" help:"run key"`
	URL string `param:"url,required" help:"the provider (see provider)"`
	// Lost makes the call take the payment and lose the answer: its
	// outcome is unknown, and the job has no reconcile function.
	Lost bool `param:"lost" default:"false" help:"the provider's answer is lost"`
}

// payOpJob pays once through the provider (pay, a payReceipt), then
// records the receipt (record): what a later step that used a resolution
// looks like.
var payOpJob = jobs.Define("payop", func(ctx context.Context, run *steps.Run, p payOpParams) error {
	receipt, err := steps.Call(ctx, run, "pay", func(ctx context.Context, key string) (payReceipt, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.URL+"/pay", nil)
		if err != nil {
			return payReceipt{}, steps.Permanent(err)
		}
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return payReceipt{}, steps.OutcomeUnknown(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil || p.Lost {
			return payReceipt{}, steps.OutcomeUnknown(errors.New("the provider's answer was lost"))
		}
		return payReceipt{ID: string(body), Amount: 1200}, nil
	})
	if err != nil {
		return err
	}
	_, err = steps.Do(ctx, run, "record", func(ctx context.Context) (string, error) {
		return fmt.Sprintf("recorded %s for %d", receipt.ID, receipt.Amount), nil
	})
	return err
}, jobs.Help("test job: one payment through the provider, then a step using its receipt"))

func callOpsRegistry() *jobs.Registry {
	var reg jobs.Registry
	reg.MustRegister(payOpJob)
	return &reg
}

// callOps runs the command line on one database with the payop job.
type callOps struct {
	*opsCLI
	prov *provider
}

func newCallOps(t *testing.T) callOps {
	return callOps{opsCLI: newOpsCLI(t), prov: newProvider(t)}
}

func (c callOps) want(code int, texts []string, args ...string) opsOut {
	c.t.Helper()
	args = append([]string{"--db", c.db}, args...)
	var out, errb syncBuffer
	o := opsOut{args: args, code: Execute(context.Background(), callOpsRegistry(), args, &out, &errb)}
	o.stdout, o.stderr = out.String(), errb.String()
	if o.code != code {
		c.t.Fatalf("exit %d; want %d\n%s", o.code, code, o)
	}
	for _, s := range texts {
		if !strings.Contains(o.stdout+o.stderr, s) {
			c.t.Errorf("output does not say %q\n%s", s, o)
		}
	}
	return o
}

// wantPaid fails unless the provider took n payments, all with key.
func (c callOps) wantPaid(n int, key string) {
	c.t.Helper()
	got := c.prov.paid()
	if len(got) != n {
		c.t.Fatalf("the provider took %d payments %q; want %d", len(got), got, n)
	}
	for _, k := range got {
		if k != key {
			c.t.Errorf("payment with key %q; want %q", k, key)
		}
	}
}

// TestClearingAMadeCallNeedsForce: reset --step and rerun --from-step of
// a completed outside call are refused (exit 5) naming its idempotency
// key and recorded result, and nothing is called; forced, they clear it,
// the audit names the call, and the next attempt pays again.
func TestClearingAMadeCallNeedsForce(t *testing.T) {
	t.Parallel()
	c := newCallOps(t)
	const key = "payop/a/pay"
	c.want(ExitOK, []string{"run payop/a succeeded"}, "run", "payop", "-p", "key=a", "-p", "url="+c.prov.srv.URL)
	c.wantPaid(1, key)
	named := []string{"outside call", "idempotency key " + key, `completed, result {"id":"receipt:` + key + `","amount":1200}`}
	c.want(ExitOperator, append(named, "use reset --force"), "reset", "payop/a", "--step", "pay", "--reason", "redo")
	c.want(ExitOperator, append(named, "rerunning the steps makes them again", "--force"),
		"rerun", "payop/a", "--from-step", "pay", "--reason", "redo")
	c.want(ExitOK, nil, "resume", "payop/a", "--force")
	c.wantPaid(1, key)
	c.wantAudits("payop/a")

	c.want(ExitOK, []string{"step pay of payop/a cleared"}, "reset", "payop/a", "--step", "pay", "--reason", "provider lost it", "--force")
	as := c.wantAudits("payop/a", "reset --step pay")
	if d := as[0].Details; !strings.Contains(d, "outside calls cleared") || !strings.Contains(d, key) || !strings.Contains(d, `"amount":1200`) {
		t.Errorf("the reset's audit details %q; want the call cleared, its key and result", d)
	}
	c.want(ExitOK, []string{"succeeded"}, "resume", "payop/a")
	c.wantPaid(2, key)

	c.want(ExitOK, []string{"outside calls already made are NOT undone (--force)", key},
		"rerun", "payop/a", "--from-step", "pay", "--reason", "pay again", "--force")
	as = c.wantAudits("payop/a", "reset --step pay", "rerun --from-step pay")
	if d := as[1].Details; !strings.HasPrefix(d, "cleared pay") || !strings.Contains(d, "outside calls cleared") || !strings.Contains(d, key) {
		t.Errorf("the rerun's audit details %q; want the steps and the call cleared, with its key", d)
	}
	c.wantPaid(3, key)
}

// TestResolveRefusesAnOutputThatDoesNotFit: the README's old example, a
// value of the wrong shape, is refused naming the output type's shape
// and changes nothing; one that fits is recorded and the run goes on
// without calling again. A call of unknown outcome is not reset without
// --force either.
func TestResolveRefusesAnOutputThatDoesNotFit(t *testing.T) {
	t.Parallel()
	c := newCallOps(t)
	const key = "payop/u/pay"
	c.want(ExitOperator, []string{"outcome of outside call pay of run payop/u is unknown"},
		"run", "payop", "-p", "key=u", "-p", "url="+c.prov.srv.URL, "-p", "lost=true")
	c.wantPaid(1, key)
	c.want(ExitOperator, []string{"idempotency key " + key, "outcome unknown", "use reset --force"},
		"reset", "payop/u", "--step", "pay", "--reason", "x")

	shape := `{"id": string, "amount": integer (int64)}`
	for out, why := range map[string]string{
		`"rcpt-77"`:                         "$ is a string, want " + shape,
		`{"id":"rcpt-77","receipt":1}`:      `$ has no field "receipt" (its fields: id, amount)`,
		`{"id":"rcpt-77","amount":"12.00"}`: "$.amount is a string, want integer (int64)",
		`{"id":"rcpt-77","amount":12.5}`:    "$.amount is 12.5, not an integer",
	} {
		c.want(ExitUsage, []string{"does not fit its output type " + shape, why},
			"resolve", "payop/u", "--step", "pay", "--as", "done", "--output", out, "--reason", "seen in the dashboard")
	}
	c.wantAudits("payop/u")
	o := c.want(ExitOK, nil, "show", "payop/u", "--json")
	if !strings.Contains(o.stdout, `"output_shape": "{\"id\": string, \"amount\": integer (int64)}"`) || !strings.Contains(o.stdout, `"key": "`+key+`"`) {
		t.Errorf("show --json does not give the call's key and output shape\n%s", o)
	}

	c.want(ExitOK, []string{"resolved as done"},
		"resolve", "payop/u", "--step", "pay", "--as", "done", "--output", `{"id":"rcpt-77","amount":1200}`, "--reason", "seen in the dashboard")
	c.want(ExitOK, []string{"succeeded"}, "resume", "payop/u")
	c.wantPaid(1, key)
	if got := c.run("payop/u").steps["record"].Output; string(got) != `"recorded rcpt-77 for 1200"` {
		t.Errorf("record's output %s; want the resolved receipt", got)
	}
	// Resolved as done, it is a call that was made.
	c.want(ExitOperator, []string{"idempotency key " + key, `resolved as done by`, `result {"id":"rcpt-77","amount":1200}`},
		"rerun", "payop/u", "--from-step", "pay", "--reason", "x")
}

// TestResolveReplaceUntilUsed: a wrong resolution is replaced with
// --replace (audited) while no later attempt recorded a step; once one
// did (record used the receipt), --replace is refused naming it.
func TestResolveReplaceUntilUsed(t *testing.T) {
	t.Parallel()
	c := newCallOps(t)
	c.want(ExitOperator, nil, "run", "payop", "-p", "key=r", "-p", "url="+c.prov.srv.URL, "-p", "lost=true")
	resolve := func(code int, texts []string, out string, more ...string) {
		c.t.Helper()
		c.want(code, texts, append([]string{"resolve", "payop/r", "--step", "pay", "--as", "done", "--output", out, "--reason", "checked"}, more...)...)
	}
	resolve(ExitOperator, []string{"step pay of payop/r is calling and was not resolved by an operator"}, `{"id":"rcpt-7","amount":1200}`, "--replace")
	resolve(ExitOK, nil, `{"id":"rcpt-7","amount":1200}`)
	resolve(ExitOperator, []string{"is completed, not an outside call of unknown outcome", "it was resolved as done by"}, `{"id":"rcpt-77","amount":1200}`)
	resolve(ExitOK, []string{"resolution replaced: resolved as done"}, `{"id":"rcpt-77","amount":1200}`, "--replace")
	resolve(ExitUsage, []string{"does not fit"}, `{"id":77}`, "--replace")
	c.want(ExitUsage, []string{`run payop/r has no step "nope"`}, "resolve", "payop/r", "--step", "nope", "--as", "done", "--output", "1", "--reason", "x")
	as := c.wantAudits("payop/r", "resolve --step pay --as done", "resolve --step pay --as done --replace")
	if d := as[1].Details; !strings.Contains(d, `output {"id":"rcpt-77","amount":1200}; replaces completed, output {"id":"rcpt-7","amount":1200}`) {
		t.Errorf("the replacement's audit details %q; want its output and the one it replaced", d)
	}

	c.want(ExitOK, []string{"succeeded"}, "resume", "payop/r")
	if got := c.run("payop/r").steps["record"].Output; string(got) != `"recorded rcpt-77 for 1200"` {
		t.Errorf("record's output %s; want the replaced receipt", got)
	}
	resolve(ExitOperator, []string{"the resolution of step pay of payop/r", "was used: record was recorded by a later attempt"},
		`{"id":"rcpt-78","amount":1200}`, "--replace")
	c.wantAudits("payop/r", "resolve --step pay --as done", "resolve --step pay --as done --replace")
	c.wantPaid(1, "payop/r/pay")
}

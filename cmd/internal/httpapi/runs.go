package httpapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/jobs"
	"github.com/stepwise-run/stepwise/runner"
	"github.com/stepwise-run/stepwise/runner/ops"
)

// RunsView is one page of GET /api/v1/runs.
type RunsView struct {
	Runs []ops.RunView `json:"runs"`
	// Next, when more runs may follow, is the cursor of the next page.
	Next string `json:"next,omitempty"`
}

// RunLink is the API path of a run.
func RunLink(runID string) string { return "/api/v1/runs/" + escapeID(runID) }

// escapeID escapes each segment of an ID, keeping its slashes.
func escapeID(id string) string {
	segs := strings.Split(id, "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	return strings.Join(segs, "/")
}

func encodeCursor(c *checkpoint.RunCursor) string {
	if c == nil {
		return ""
	}
	return base64.RawURLEncoding.EncodeToString([]byte(c.CreatedAt.UTC().Format(time.RFC3339Nano) + " " + c.ID))
}

func decodeCursor(s string) (*checkpoint.RunCursor, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err == nil {
		at, id, ok := strings.Cut(string(b), " ")
		t, terr := time.Parse(time.RFC3339Nano, at)
		if ok && terr == nil && id != "" {
			return &checkpoint.RunCursor{CreatedAt: t, ID: id}, nil
		}
	}
	return nil, badRequest("cursor", "cursor %q is not one this API returned as next", s)
}

func parseTime(field, s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return t, badRequest(field, "%s %q is not an RFC 3339 time such as 2026-11-28T00:00:00Z", field, s)
	}
	return t, nil
}

func parseLimit(q url.Values, def, max int) (int, error) {
	s := q.Get("limit")
	if s == "" {
		return def, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > max {
		return 0, badRequest("limit", "limit %q: give a whole number from 1 to %d", s, max)
	}
	return n, nil
}

var runStatuses = ops.RunStatuses

func (s *Server) listRuns(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	rq := ops.RunsQuery{Job: q.Get("job"), Status: q.Get("status"), RunKeyPrefix: q.Get("key_prefix")}
	var err error
	if rq.Status != "" && !contains(runStatuses, rq.Status) {
		s.fail(w, r, badRequest("status", "status %q: want one of %s", rq.Status, strings.Join(runStatuses, ", ")))
		return
	}
	if rq.Since, err = parseTime("since", q.Get("since")); err == nil {
		rq.Until, err = parseTime("until", q.Get("until"))
	}
	if err == nil {
		rq.Limit, err = parseLimit(q, 100, 1000)
	}
	if err == nil && q.Get("cursor") != "" {
		rq.After, err = decodeCursor(q.Get("cursor"))
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	page, err := ops.ListRuns(r.Context(), s.cfg.Store, rq, ops.Now(r.Context(), s.cfg.Store, s.cfg.Now()))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, RunsView{Runs: page.Runs, Next: encodeCursor(page.Next)})
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// runPath is a path below /api/v1/runs/: a run ID, then what of it.
type runPath struct {
	RunID string
	Step  string // after /steps/
	Verb  string // "" (the run), resume, rerun, abandon, recover; items, reset, resolve (of Step)
}

// parseRunPath splits the path after /api/v1/runs/. A run ID is JOB/KEY,
// and a key of several parameters has several segments: the job's
// identifying parameters say how many (one for a job not registered). A
// run ID may also come as one segment with its slashes escaped (%2F).
func (s *Server) parseRunPath(r *http.Request) (runPath, bool) {
	esc := strings.TrimPrefix(r.URL.EscapedPath(), "/api/v1/runs/")
	var segs []string
	for _, e := range strings.Split(esc, "/") {
		u, err := url.PathUnescape(e)
		if err != nil || u == "" {
			return runPath{}, false
		}
		segs = append(segs, u)
	}
	n := 2
	if strings.Contains(segs[0], "/") {
		n = 1
	} else if j, err := s.cfg.Jobs.Lookup(segs[0]); err == nil {
		n = 1
		for _, p := range j.Params() {
			if p.Key {
				n++
			}
		}
	}
	if len(segs) < n {
		return runPath{}, false
	}
	p := runPath{RunID: strings.Join(segs[:n], "/")}
	rest := segs[n:]
	switch {
	case len(rest) == 0:
	case len(rest) == 1:
		p.Verb = rest[0]
	case rest[0] == "steps" && len(rest) >= 3:
		p.Step, p.Verb = strings.Join(rest[1:len(rest)-1], "/"), rest[len(rest)-1]
	default:
		return runPath{}, false
	}
	return p, true
}

func (s *Server) noRoute(w http.ResponseWriter, r *http.Request) {
	s.fail(w, r, &apiError{Status: http.StatusNotFound, Code: "not_found", Message: "no such endpoint: " + r.Method + " " + r.URL.Path})
}

func (s *Server) runGet(w http.ResponseWriter, r *http.Request) {
	p, ok := s.parseRunPath(r)
	switch {
	case !ok:
		s.noRoute(w, r)
	case p.Verb == "" && p.Step == "":
		s.takes(func(w http.ResponseWriter, r *http.Request) { s.getRun(w, r, p.RunID) }, "limit")(w, r)
	case p.Verb == "items" && p.Step != "":
		s.takes(func(w http.ResponseWriter, r *http.Request) { s.getItems(w, r, p) }, "status", "limit", "cursor")(w, r)
	default:
		s.noRoute(w, r)
	}
}

func (s *Server) getRun(w http.ResponseWriter, r *http.Request, runID string) {
	q := r.URL.Query()
	limit, err := parseLimit(q, 50, 10000)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	v, err := ops.Show(r.Context(), s.cfg.Store, runID, ops.ShowOptions{Effects: true, ChunkPlans: limit}, ops.Now(r.Context(), s.cfg.Store, s.cfg.Now()))
	if errors.Is(err, checkpoint.ErrNotFound) {
		err = notFound(runID)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

var itemStatuses = []string{checkpoint.StepRejected, checkpoint.ItemSkipped, checkpoint.StepCompleted, checkpoint.StepPlanned}

func (s *Server) getItems(w http.ResponseWriter, r *http.Request, p runPath) {
	q := r.URL.Query()
	status := q.Get("status")
	if !contains(itemStatuses, status) {
		s.fail(w, r, badRequest("status", "status %q: want one of %s", status, strings.Join(itemStatuses, ", ")))
		return
	}
	limit, err := parseLimit(q, 100, 1000)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	ctx := r.Context()
	steps, err := ops.RunSteps(ctx, s.cfg.Store, p.RunID)
	if errors.Is(err, checkpoint.ErrNotFound) {
		err = notFound(p.RunID)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	found := false
	var ids []string
	for _, st := range steps {
		found = found || st.ID == p.Step
		ids = append(ids, st.ID)
	}
	if !found {
		s.fail(w, r, &ops.NoStepError{RunID: p.RunID, Step: p.Step, Steps: ids})
		return
	}
	bs, err := ops.Batches(ctx, s.cfg.Store, p.RunID, steps, s.cfg.Now())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	page, err := ops.Items(ctx, s.cfg.Store, ops.ItemsQuery{RunID: p.RunID, Step: p.Step, Status: status, AfterKey: q.Get("cursor"), Limit: limit}, bs)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	v := ItemsView{Status: page.Status, Total: page.Total, Items: page.Items}
	if page.Next != "" {
		v.Next = page.Items[len(page.Items)-1].Key
	}
	writeJSON(w, http.StatusOK, v)
}

// ItemsView is one page of a batch step's items of one status.
type ItemsView struct {
	Status string           `json:"status"`
	Total  int64            `json:"total"`
	Items  []ops.ListedItem `json:"items"`
	// Next, when more items follow, is the cursor of the next page (the
	// last item's key).
	Next string `json:"next,omitempty"`
}

// StartBody is the body of POST /api/v1/runs.
type StartBody struct {
	Job string `json:"job"`
	// Params are the job's parameters: a string is taken as the CLI's -p
	// NAME=VALUE is, any other JSON value as in a --params-file, except
	// that a parameter naming a file or a database takes the name of a
	// target the server's operator configured (Config.Targets), never a
	// path or URL.
	Params map[string]json.RawMessage `json:"params"`
}

// StartView is the answer of POST /api/v1/runs.
type StartView struct {
	ID      string `json:"id"`
	Status  string `json:"status"`
	Link    string `json:"link"`
	Created bool   `json:"created"`
	// Replayed is true when an Idempotency-Key already answered this
	// request: the run is the one that request named.
	Replayed bool `json:"replayed,omitempty"`
}

// IdempotencyHeader is the request header naming an idempotency key.
const IdempotencyHeader = "Idempotency-Key"

// idempotencyScope is the scope an Idempotency-Key of r is recorded in:
// its caller's, so that two callers that pick the same key make two
// independent requests and neither is answered with the other's run or
// refused for the other's parameters. It is "token:NAME" for a request
// authenticated by the token NAME, whether as a bearer token or through
// the cookie its login set (one caller, as in the audit trail), and
// whatever its secret (a rotated token keeps its keys; a renamed one
// starts anew, its retries then answered by the run their run key
// names, created false); and "local" for an anonymous request (a server
// without tokens, whose requests all come from this machine; it takes no
// writes today). No scope is empty: the empty scope holds the keys
// recorded before keys were scoped.
func idempotencyScope(r *http.Request) string {
	if id, ok := Caller(r); ok {
		return "token:" + id.Name
	}
	return "local"
}

func (s *Server) createRun(w http.ResponseWriter, r *http.Request) {
	job, values, file, dec, err := s.startBody(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	runID := jobs.RunID(job.Name(), dec.RunKey)
	key := r.Header.Get(IdempotencyHeader)
	// From the key's begin to its finish or drop, and the start between,
	// the work is not cut short by a client that hangs up: a run claimed
	// is recorded as such, and a key begun is settled (else it would stay
	// accepting, every retry 409, for AcceptTimeout).
	ctx := context.WithoutCancel(r.Context())
	hold, answered := s.holdKey(ctx, w, r, key, job, dec, runID)
	if answered {
		return
	}
	started, err := s.cfg.Starter.Start(ctx, runner.Request{Job: job.Name(), Values: values, ParamsFile: file, CreateOnly: true})
	var exists *checkpoint.RunExistsError
	pruned := false // the run exists and was pruned
	switch {
	case errors.As(err, &exists):
		started, err = Started{RunID: exists.Run.ID, Status: exists.Run.Status}, nil
		pruned = !exists.Run.PrunedAt.IsZero()
	case err != nil:
		if key != "" {
			// Only this request's hold is dropped: a retry that took the
			// key over (this one was slow) keeps it.
			s.dropKey(ctx, r, hold)
		}
		s.fail(w, r, err)
		return
	}
	if key != "" {
		if err := s.settleKey(ctx, w, r, key, hold, pruned, runID); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	code := http.StatusOK
	if started.Created {
		code = http.StatusCreated
		w.Header().Set("Location", RunLink(started.RunID))
		who, _ := Caller(r)
		s.cfg.Logger.Info().Str("request_id", RequestID(r)).Str("token", who.Name).Str("run_id", started.RunID).Msg("api started a run")
	}
	writeJSON(w, code, StartView{ID: started.RunID, Status: started.Status, Link: RunLink(started.RunID), Created: started.Created})
}

// startBody reads a start request's body: its job, and the job's
// parameters decoded.
func (s *Server) startBody(r *http.Request) (job jobs.Job, values map[string]string, file []byte, dec jobs.Decoded, err error) {
	var b StartBody
	if err := s.decode(r, &b); err != nil {
		return nil, nil, nil, dec, err
	}
	if b.Job == "" {
		return nil, nil, nil, dec, badRequest("job", `the body needs "job": the name of a registered job`)
	}
	job, err = s.cfg.Jobs.Lookup(b.Job)
	if err != nil {
		var names []string
		for _, j := range s.cfg.Jobs.Jobs() {
			names = append(names, j.Name())
		}
		return nil, nil, nil, dec, &apiError{Status: http.StatusNotFound, Code: "not_found", Field: "job",
			Message: fmt.Sprintf("no job %q: this server runs %s", b.Job, strings.Join(names, ", "))}
	}
	values, file, err = splitParams(b.Params)
	if err == nil {
		// Files and databases only by the names the operator configured.
		values, err = jobs.RequestValues(job, values, s.cfg.Targets)
	}
	if err != nil {
		return nil, nil, nil, dec, err
	}
	dec, err = job.Decode(values, file)
	if err != nil {
		return nil, nil, nil, dec, err
	}
	return job, values, file, dec, nil
}

// holdKey begins the request's Idempotency-Key, if it has one: hold is
// this request's hold on it. answered is true when the request was
// answered instead (a bad key, a key already recorded: its replay, or a
// store error).
func (s *Server) holdKey(ctx context.Context, w http.ResponseWriter, r *http.Request, key string, job jobs.Job, dec jobs.Decoded, runID string) (hold checkpoint.IdempotencyKey, answered bool) {
	if key == "" {
		return hold, false
	}
	now := s.cfg.Now()
	if len(key) > 255 || strings.ContainsFunc(key, func(c rune) bool { return c < 0x21 || c > 0x7e }) {
		s.fail(w, r, badRequest(IdempotencyHeader, "%s must be 1 to 255 printable ASCII characters without spaces", IdempotencyHeader))
		return hold, true
	}
	sum := sha256.Sum256([]byte(job.Name() + "\n" + dec.Hash))
	rec, begun, err := s.cfg.Store.BeginIdempotency(ctx, checkpoint.IdempotencyKey{Scope: idempotencyScope(r), Key: key,
		RequestHash: hex.EncodeToString(sum[:]), Job: job.Name(), Params: dec.JSON, RunID: runID, CreatedAt: now}, now.Add(-s.cfg.AcceptTimeout))
	if err != nil {
		s.fail(w, r, err)
		return hold, true
	}
	if !begun {
		s.replay(w, r, key, rec, hex.EncodeToString(sum[:]), job.Name(), dec.JSON)
		return hold, true
	}
	return rec, false
}

// settleKey records the request's key as answered by its run, or drops it
// when the run was pruned (its tombstone answers every start of its run
// key: recording this key would only keep it forever).
func (s *Server) settleKey(ctx context.Context, w http.ResponseWriter, r *http.Request, key string, hold checkpoint.IdempotencyKey, pruned bool, runID string) error {
	if pruned {
		// The prune of the run deleted its keys.
		s.dropKey(ctx, r, hold)
		return nil
	}
	err := s.cfg.Store.FinishIdempotency(ctx, hold, s.cfg.Now())
	var lost *checkpoint.IdempotencyLostError
	if errors.As(err, &lost) {
		// Another request took the key over while this one was slow:
		// the key answers for that one; a retry gets its answer.
		w.Header().Set("Retry-After", "1")
		err = &apiError{Status: http.StatusConflict, Code: "conflict", Field: IdempotencyHeader,
			Message: fmt.Sprintf("this request with %s %q took longer than %s to be accepted, and another request with the key took it over: "+
				"retry to get the key's answer (run %s)", IdempotencyHeader, key, s.cfg.AcceptTimeout, runID)}
	}
	return err
}

// dropKey drops this request's hold on its key, logging a failure.
func (s *Server) dropKey(ctx context.Context, r *http.Request, hold checkpoint.IdempotencyKey) {
	if derr := s.cfg.Store.DropIdempotency(ctx, hold); derr != nil {
		s.cfg.Logger.Error().Err(derr).Str("request_id", RequestID(r)).Msg("could not drop an idempotency key")
	}
}

// replay answers a request whose Idempotency-Key is recorded.
func (s *Server) replay(w http.ResponseWriter, r *http.Request, key string, rec checkpoint.IdempotencyKey, hash, job string, params []byte) {
	switch {
	case rec.RequestHash != hash:
		s.fail(w, r, &apiError{Status: http.StatusUnprocessableEntity, Code: "idempotency_conflict", Field: IdempotencyHeader,
			Message: fmt.Sprintf("%s %q was first used at %s to start job %s with params %s (run %s); this request asks for job %s with params %s: "+
				"an Idempotency-Key always means the same request, so use a new key for another one",
				IdempotencyHeader, key, rec.CreatedAt.UTC().Format(time.RFC3339), rec.Job, rec.Params, rec.RunID, job, params)})
	case rec.State == checkpoint.IdempotencyAccepting:
		w.Header().Set("Retry-After", "1")
		s.fail(w, r, &apiError{Status: http.StatusConflict, Code: "conflict", Field: IdempotencyHeader,
			Message: fmt.Sprintf("the first request with %s %q (run %s) is still being accepted; retry in a moment", IdempotencyHeader, key, rec.RunID)})
	default:
		info, err := s.cfg.Store.Run(r.Context(), rec.RunID)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, StartView{ID: rec.RunID, Status: info.Run.Status, Link: RunLink(rec.RunID), Replayed: true})
	}
}

// splitParams gives a start's parameters to the job as the command line
// does: strings as -p NAME=VALUE, other JSON values as a params file.
func splitParams(ps map[string]json.RawMessage) (map[string]string, []byte, error) {
	values := map[string]string{}
	rest := map[string]json.RawMessage{}
	for name, raw := range ps {
		t := bytes.TrimSpace(raw)
		if len(t) > 0 && t[0] == '"' {
			var s string
			if err := json.Unmarshal(t, &s); err != nil {
				return nil, nil, badRequest("params."+name, "params.%s is not a JSON string: %v", name, err)
			}
			values[name] = s
			continue
		}
		rest[name] = raw
	}
	if len(rest) == 0 {
		return values, nil, nil
	}
	file, err := json.Marshal(rest)
	return values, file, err
}

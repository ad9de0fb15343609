// Package httpapi is Stepwise's HTTP API: JSON under /api/v1, the runs,
// their steps and items and the schedules to read, runs to start with
// Idempotency-Key semantics, and the manual operations, each refused
// exactly as the command line refuses it (both call package ops) and
// recorded in the run's audit trail under the caller's token name.
//
// Import rule: httpapi imports ops, runner, jobs, steps and checkpoint
// (it is handed a checkpoint.Backend); cmd imports it (`serve --listen`).
//
// Security: every request but login is authenticated by a bearer token
// (Authorization: Bearer TOKEN) from a tokens file (see ParseTokens), or
// by the cookie login sets for browsers: a random session ID held in
// memory (never the token), ended by logout, by Config.SessionIdle and
// SessionMax, and when its token leaves the file (Server.ReloadTokens);
// tokens compare in constant time. A missing or wrong token is 401, a read
// token on a write 403; failed authentication is logged (address, reason,
// never the token), counted (stepwise_http_auth_failures_total) and
// throttled per client address (429 past Config.AuthFailures); a server
// without tokens serves reads only, and only to requests whose Host is
// localhost, 127.0.0.1 or [::1] (any port): another Host is 421
// Misdirected Request, code "misdirected", so that a page of another site
// that points its own name at this machine (DNS rebinding) reads nothing
// (GuardHost does the same for the handlers beside the API).
// Cookie-authenticated writes need the X-CSRF-Token header login returned
// (an HMAC of the session, checked in constant time) and must pass
// net/http's cross-origin protection (Sec-Fetch-Site, else Origin against
// Host); so does a logout with the session cookie. Request bodies are
// limited (413); an unexpected error is logged with a request id and
// answered with that id only, never its text.
//
// An Idempotency-Key is the caller's own: keys are recorded per caller
// (scope "token:NAME", one scope for a token whether it comes as a bearer
// token or through the cookie its login set; one scope, "local", for a
// server without tokens, were it to take writes), as Stripe scopes them
// per account. The same key from two callers is two independent requests,
// each replayed, refused (422, naming that caller's first request) or
// held (409 while being accepted) only for its own caller; the second of
// two callers starting the same run is answered as any start of an
// existing run is (200, created false). Keys recorded before keys were
// scoped (schema migrations sqlite 0012, postgres 0010) are kept in the
// empty scope, which no caller has: they are never replayed. Pruning a
// run (stepwise prune) deletes its keys; a start with one afterwards is
// answered by its run key, as a start without a key is (200, created
// false, the tombstone's status), and the key is not recorded again.
//
// A start's parameters that name a file or a database (formats path,
// existingfile, database) are names of the targets the operator configured
// (Config.Targets): a path, URL, connection string or unknown name is 400
// with code "bad_params" naming the configured targets, and nothing is
// opened or dialled for it; the run stores "target:NAME".
//
// A start (POST /api/v1/runs), resume or rerun over its job's concurrency
// limit is refused, as the command line refuses it, with 409 and code
// "limit_reached": the error names the limit and the runs holding it, and
// so do the body's "limit" and "holders". Nothing is recorded (a start's
// Idempotency-Key is dropped): start it again when one of those runs has
// ended.
//
// The outbox: GET /api/v1/outbox?status=queued|sent|dead&run=RUN_ID&limit=N
// (read role; limit 1 to 1000, default 100) answers {"messages": [...]},
// oldest first, each as `stepwise outbox --json` shows it (ops.OutboxView),
// and "more": true when more match. POST /api/v1/outbox/requeue (operate
// role, a manual operation like those on runs) sends dead messages again
// (ops.RequeueDead): the body names them by exactly one of "keys":
// [KEY, ...], "run": RUN_ID or "all_dead": true, with a "reason"; a bad
// selection or a missing reason is 400 naming the field, an unknown key or
// run 404 (field "keys" or "run", nothing requeued). It answers 200 with
// what `outbox requeue --json` prints (requeued, not_dead: named messages
// queued or sent, left as they are; operator, the token's name; reason;
// at) and "result" in words, and is recorded in the audit trail of each
// run whose messages it requeued.
//
// Schedules: GET /api/v1/schedules lists them with who paused one, when
// and why ("paused"), the fires its pause holds ("held_by_pause") and
// those its last unpause skipped ("skipped_for_pause").
// POST /api/v1/schedules/{name}/pause and /unpause (operate role) take
// {"reason": ...} and, for unpause, "catch_up": true to run the held fires
// under the schedule's misfire policy (ops.PauseSchedule,
// ops.UnpauseSchedule); a missing reason or a catch_up on pause is 400
// naming the field, an unknown schedule 404 (field "name"), a schedule
// already paused (or, for unpause, not paused) 409 "needs_decision". Each
// commits with its audit record (key checkpoint.ScheduleAuditID(name))
// under the token's name. GET /api/v1/jobs/{job}/history?limit=N (read
// role; default 30, at most 200) is the dashboard's job page as JSON
// (ops.History, ops.CountRuns).
//
// The common case, beside /healthz and /metrics:
//
//	api, err := httpapi.New(httpapi.Config{Store: st, Jobs: registry, Starter: httpapi.NewLocal(r), Tokens: tokens})
//	mux.Handle("/api/", api)
package httpapi

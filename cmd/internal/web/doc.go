// Package web is Stepwise's dashboard: server-rendered pages of the runs
// (counted by status at the top), one run (its step timeline, live batch
// progress, rejected and skipped items, effects before -> after per key,
// outbox and audit trail, and the operating actions), one job (its last
// runs charted: duration, and batch items posted, rejected and skipped, as
// SVG drawn by the server's templates) and the schedules (with the pause
// button), served from files embedded in the binary (no build step, no
// CDN, no external fonts) under `serve --listen`.
//
// Import rule: web imports ops, runner, steps and checkpoint (it is handed
// a checkpoint.Backend) and never SQL; cmd imports it. It reads through the
// ops views the HTTP API serializes, so the pages and the API show the same
// numbers. It writes nothing itself: the pages' scripts log in and operate
// through the HTTP API (login, session, the run operations, pausing a
// schedule, with its CSRF token), so a refusal on a page is the API's, in the command line's words.
// Its pages sit behind the API's authentication (see Auth).
//
// The common case, beside the API, /healthz and /metrics:
//
//	dash, err := web.New(web.Config{Store: st, Auth: auth, Schedules: schedules})
//	mux.Handle("/", dash)
package web

package web_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stepwise-run/stepwise/cmd/internal/web"
)

// A page's path and query parameters are text: a NUL, invalid UTF-8 or a
// control character is 400 naming the parameter, on either store, before
// the store is asked (PostgreSQL refuses a NUL in text, which was a 500).
func TestPageParametersAreText(t *testing.T) {
	st, _ := failedSettle(t)
	srv := serve(t, web.Config{Store: st})
	for path, names := range map[string]string{
		"/?job=set%00tle":               "query parameter job",
		"/?key=2026%FF":                 "query parameter key",
		"/?status=failed%1B":            "query parameter status",
		"/runs/settle/2026-11-28%00":    "path",
		"/runs/settle/caf%E9":           "path",
		"/runs/settle/2026-11-28?q=%00": "query parameter q",
	} {
		res, body := get(t, srv, path)
		if res.StatusCode != http.StatusBadRequest || !strings.Contains(body, names) {
			t.Errorf("GET %s: %s; want 400 naming %s\n%s", path, res.Status, names, text(body))
		}
	}
	if res, _ := get(t, srv, "/?job=settle"); res.StatusCode != http.StatusOK {
		t.Errorf("GET /?job=settle: %s; want 200", res.Status)
	}
}

package httpapi

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
)

// checkParams refuses a query parameter the endpoint does not take: 400
// naming it and the ones it takes, instead of ignoring it (an ignored
// items?after=KEY answered the first page for ever).
func checkParams(r *http.Request, takes ...string) error {
	var unknown []string
	for name := range r.URL.Query() {
		if !slices.Contains(takes, name) {
			unknown = append(unknown, name)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	slices.Sort(unknown)
	endpoint := r.Method + " " + r.URL.Path
	what := "takes no query parameters"
	if len(takes) > 0 {
		what = "takes " + strings.Join(takes, ", ")
	}
	msg := fmt.Sprintf("unknown query parameter %q: %s %s", unknown[0], endpoint, what)
	if len(unknown) > 1 {
		msg = fmt.Sprintf("unknown query parameters %s: %s %s", quoteAll(unknown), endpoint, what)
	}
	if slices.Contains(unknown, "after") && slices.Contains(takes, "cursor") {
		msg += `; the next page is cursor=NEXT, NEXT being the "next" of the page before`
	}
	return badRequest(unknown[0], "%s", msg)
}

func quoteAll(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = fmt.Sprintf("%q", n)
	}
	return strings.Join(q, ", ")
}

// takes wraps an endpoint's handler with checkParams.
func (s *Server) takes(h http.HandlerFunc, params ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := checkParams(r, params...); err != nil {
			s.fail(w, r, err)
			return
		}
		h(w, r)
	}
}

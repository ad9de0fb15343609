package cmd

import (
	"net/http"

	"github.com/stepwise-run/stepwise/cmd/internal/httpapi"
	"github.com/stepwise-run/stepwise/cmd/internal/web"
)

// apiAuth puts the dashboard's pages behind the HTTP API's
// authentication: the same tokens, the same session cookie, the same
// caller in the audit trail.
type apiAuth struct{ api *httpapi.Server }

var _ web.Auth = apiAuth{}

// Require implements web.Auth: reading a page needs the read role.
func (a apiAuth) Require(next http.Handler) http.Handler { return a.api.Auth(httpapi.RoleRead, next) }

// Caller implements web.Auth.
func (a apiAuth) Caller(r *http.Request) (web.Caller, bool) {
	id, ok := httpapi.Caller(r)
	return web.Caller{Name: id.Name, CanOperate: id.Role == httpapi.RoleOperate}, ok
}

package checkpoint

import (
	"net/url"
	"strings"
)

// secretParams are the URL query parameters that carry a secret in a
// libpq-style connection URL.
var secretParams = []string{"password", "sslpassword"}

// HasSecret reports whether the URL u carries a password: in its user
// information or in a query parameter (password=, sslpassword=).
func HasSecret(u *url.URL) bool {
	if _, ok := u.User.Password(); ok {
		return true
	}
	q := u.Query()
	for _, k := range secretParams {
		if q.Has(k) {
			return true
		}
	}
	return false
}

// IsPostgresURL reports whether loc names a PostgreSQL database: a
// postgres:// or postgresql:// URL, the scheme in any case. Anything else
// is a SQLite file path (or, with another scheme, no location a backend
// opens). Every layer that tells the two kinds apart asks this.
func IsPostgresURL(loc string) bool {
	scheme, _, ok := strings.Cut(loc, "://")
	return ok && (strings.EqualFold(scheme, "postgres") || strings.EqualFold(scheme, "postgresql"))
}

// RedactLocation returns a store or target location fit for a message: a
// URL with every password replaced by xxxxx (in its user information and
// in password= or sslpassword= parameters); anything that is not a URL
// (a file path) as it is. A URL that does not parse is shown by its
// scheme alone, since where its password ends cannot be told.
func RedactLocation(loc string) string {
	scheme, _, ok := strings.Cut(loc, "://")
	if !ok {
		return loc
	}
	u, err := url.Parse(loc)
	if err != nil {
		return scheme + "://(a URL that does not parse)"
	}
	q := u.Query()
	changed := false
	for _, k := range secretParams {
		if q.Has(k) {
			q.Set(k, "xxxxx")
			changed = true
		}
	}
	if changed {
		u.RawQuery = q.Encode()
	}
	return u.Redacted()
}

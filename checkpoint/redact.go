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

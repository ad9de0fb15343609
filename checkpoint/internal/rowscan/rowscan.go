// Package rowscan holds the reading of result sets the checkpoint
// backends share: both drivers' rows (database/sql's *sql.Rows, pgx's
// pgx.Rows) are walked the same way, and only how a row is scanned
// differs between them.
package rowscan

// Rows is what both drivers' result sets offer to walk them.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// Collect scans every row of rows with scan, in order. It stops at the
// first error of scan or of the result set; the caller closes rows.
func Collect[T any](rows Rows, scan func(Rows) (T, error)) ([]T, error) {
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

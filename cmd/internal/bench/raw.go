package bench

// What the two hand-written settlements (raw_sqlite.go, raw_postgres.go)
// do alike: page through the day's transfers Chunk at a time, and load a
// run's item keys for the rerun baseline. Only the SQL and the drivers
// differ.

// scanRows is what database/sql's and pgx's result sets both offer.
type scanRows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// rawTransfer is one transfer of the day, as the raw settlements read it.
type rawTransfer struct {
	id, from, to string
	amount       int64
}

// rawPage is a raw settlement's place in the day's transfers: the page
// read last and the transfer ID the next page starts after.
type rawPage struct {
	after string
	xs    []rawTransfer
}

// fill replaces the page with the transfers rows holds (id, from, to,
// amount). The caller closes rows.
func (p *rawPage) fill(rows scanRows) error {
	p.xs = p.xs[:0]
	for rows.Next() {
		var x rawTransfer
		if err := rows.Scan(&x.id, &x.from, &x.to, &x.amount); err != nil {
			return err
		}
		p.xs = append(p.xs, x)
	}
	return rows.Err()
}

// advance moves past the page once it is settled and reports whether it
// was the last (shorter than Chunk).
func (p *rawPage) advance() (last bool) {
	if len(p.xs) > 0 {
		p.after = p.xs[len(p.xs)-1].id
	}
	return len(p.xs) < Chunk
}

// keyStatuses is the raw rerun baseline: the (key, status) rows of a
// run's items into a map sized for n, as a hand-written rerun would load
// them; it returns how many keys the map holds.
func keyStatuses(rows scanRows, n int) (int, error) {
	keys := make(map[string]string, n)
	for rows.Next() {
		var k, s string
		if err := rows.Scan(&k, &s); err != nil {
			return 0, err
		}
		keys[k] = s
	}
	return len(keys), rows.Err()
}

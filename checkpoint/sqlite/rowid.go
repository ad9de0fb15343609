package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// A same-store chunk reads its keys and writes them in one write
// transaction (BEGIN IMMEDIATE: no other writer in between), so the rows
// it read are the rows it writes. In a table with rowids, the keys'
// read finds each row's rowid through the key's index, and the
// compare-and-set update then goes to the row by rowid, without a second
// probe of that index: a settlement chunk writes some 1,800 keys. The
// update still checks the key and the version, so a rowid that named
// another row would update nothing and be reported as a version conflict.

// rowids are the rowids of the keys read in one transaction.
type rowids struct {
	of map[string]int64
}

// prepareRowid prepares readManyRowid and updateRowid when t has rowids
// under that name: not a WITHOUT ROWID table (preparing fails) and no
// column named rowid (which the name would then mean).
func (h *tableHandle) prepareRowid(ctx context.Context, q querier) error {
	t := h.t
	cols, err := q.QueryContext(ctx, `SELECT 1 FROM pragma_table_info(?) WHERE lower(name) = 'rowid'`, t.Name)
	if err != nil {
		return fmt.Errorf("checkpoint: inspect table %s: %w", t.Name, err)
	}
	named := cols.Next()
	err = cols.Err()
	cols.Close()
	if err != nil {
		return fmt.Errorf("checkpoint: inspect table %s: %w", t.Name, err)
	}
	if named {
		return nil
	}
	rd, err := q.PrepareContext(ctx, "SELECT rowid, "+t.Key+", "+t.Value+", "+t.Version+" FROM "+t.Name+
		" WHERE "+t.Key+" IN (SELECT value FROM json_each(?))")
	if err != nil {
		return nil // WITHOUT ROWID: by key only
	}
	up, err := q.PrepareContext(ctx, "UPDATE "+t.Name+" SET "+t.Value+" = ?, "+t.Version+" = ? WHERE rowid = ? AND "+
		t.Key+" = ? AND "+t.Version+" = ?")
	if err != nil {
		rd.Close()
		return fmt.Errorf("checkpoint: prepare statement for %s: %w", t, err)
	}
	h.readManyRowid, h.updateRowid = rd, up
	return nil
}

// readSetRowid is readSet keeping each row's rowid in rows.
func (h *tableHandle) readSetRowid(ctx context.Context, tx *sql.Tx, keys []string, rows *rowids) (map[string]checkpoint.State, error) {
	arg, err := json.Marshal(keys)
	if err != nil {
		return nil, err
	}
	rs, err := h.stmt(ctx, tx, h.readManyRowid).QueryContext(ctx, string(arg))
	if err != nil {
		return nil, fmt.Errorf("checkpoint: read %d keys of %s: %w", len(keys), h.t.Name, err)
	}
	defer rs.Close()
	if rows.of == nil {
		rows.of = make(map[string]int64, len(keys))
	}
	out := make(map[string]checkpoint.State, len(keys))
	for rs.Next() {
		var k string
		var id int64
		s := checkpoint.State{Exists: true}
		if err := rs.Scan(&id, &k, &s.Value, &s.Version); err != nil {
			return nil, fmt.Errorf("checkpoint: read %d keys of %s: %w", len(keys), h.t.Name, err)
		}
		out[k], rows.of[k] = s, id
	}
	if err := rs.Err(); err != nil {
		return nil, fmt.Errorf("checkpoint: read %d keys of %s: %w", len(keys), h.t.Name, err)
	}
	return h.withMissing(keys, out)
}

// writeRowid is Write, updating the rows read in this transaction by
// rowid and any other key as Write does.
func (h *tableHandle) writeRowid(ctx context.Context, tx *sql.Tx, ws []checkpoint.Write, rows *rowids) error {
	var byKey []checkpoint.Write
	upd := h.stmt(ctx, tx, h.updateRowid)
	for _, w := range ws {
		id, ok := rows.of[w.Key]
		if w.Insert || !ok {
			byKey = append(byKey, w)
			continue
		}
		res, err := upd.ExecContext(ctx, w.NewValue, w.OldVersion+1, id, w.Key, w.OldVersion)
		if err != nil {
			return fmt.Errorf("checkpoint: write %s key %q: %w", h.t.Name, w.Key, err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return h.conflict(ctx, tx, w)
		}
	}
	if len(byKey) == 0 {
		return nil
	}
	return h.Write(ctx, tx, byKey)
}

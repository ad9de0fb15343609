package postgres

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stepwise-run/stepwise/checkpoint"
)

// querier is what a target view runs its statements on: the checkpoint
// transaction's connection, or a read-only transaction of the pool.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// pgTarget is the set-based view of one target table: one statement per
// call, whatever the number of keys. In a write transaction (tx set) its reads lock
// the rows they read (FOR UPDATE, in key order, so two writers touching
// the same keys wait for each other instead of deadlocking).
type pgTarget struct {
	q     querier
	table checkpoint.Table
	// fail records a failed statement: it aborts a PostgreSQL transaction.
	fail func(error) error
	sql  targetSQL
	// tx is the checkpoint transaction of a same-store view (nil for
	// View): Read sends BEGIN and the fence lock in its own round trip,
	// ahead of its statements, when no write has opened the transaction
	// yet; its reads lock the rows they read.
	tx *pgTx
}

// begin opens the checkpoint transaction of a same-store view before a
// statement that is not pipelined behind the fence lock.
func (g *pgTarget) begin() error {
	if g.tx == nil {
		return nil
	}
	return g.tx.open()
}

// targetSQL holds a table's statements, built once from its validated
// (and quoted) identifiers; values are always parameters.
type targetSQL struct {
	read, readLocked, versions, update, insert string
}

func newTargetSQL(t checkpoint.Table) targetSQL {
	name := pgx.Identifier{t.Name}.Sanitize()
	key := pgx.Identifier{t.Key}.Sanitize()
	val := pgx.Identifier{t.Value}.Sanitize()
	ver := pgx.Identifier{t.Version}.Sanitize()
	read := `SELECT ` + key + `, ` + val + `, ` + ver + ` FROM ` + name + ` WHERE ` + key + ` = ANY($1) ORDER BY ` + key
	return targetSQL{
		read:       read,
		readLocked: read + ` FOR UPDATE`,
		versions:   `SELECT ` + key + `, ` + ver + ` FROM ` + name + ` WHERE ` + key + ` = ANY($1)`,
		update: `UPDATE ` + name + ` AS t SET ` + val + ` = u.nv, ` + ver + ` = u.ov + 1
FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS u(k, nv, ov)
WHERE t.` + key + ` = u.k AND t.` + ver + ` = u.ov
RETURNING t.` + key,
		insert: `INSERT INTO ` + name + ` (` + key + `, ` + val + `, ` + ver + `)
SELECT u.k, u.nv, 1 FROM unnest($1::text[], $2::bigint[]) AS u(k, nv)
ON CONFLICT (` + key + `) DO NOTHING
RETURNING ` + key,
	}
}

const (
	// sqlLockKeys takes a transaction-scoped advisory lock per key of a
	// table that creates missing keys, in key order: FOR UPDATE locks only
	// rows that exist, so two writers of one new key would both read it
	// missing and one would find the other's insert at its commit.
	sqlLockKeys = `SELECT pg_advisory_xact_lock(s.h) FROM (
    SELECT hashtextextended($1 || chr(31) || k, 0) AS h FROM unnest($2::text[]) AS k ORDER BY k COLLATE "C") AS s`
	sqlIsApplied   = `SELECT EXISTS (SELECT 1 FROM stepwise_applied WHERE effect_id = $1)`
	sqlMarkApplied = `INSERT INTO stepwise_applied (effect_id, run_id, step_id, applied_at) VALUES ($1, $2, $3, $4)`
)

// Target implements checkpoint.Tx: the table, in the checkpoint database,
// written in this transaction.
func (t *pgTx) Target(table checkpoint.Table) (checkpoint.Target, error) {
	if err := table.Validate(); err != nil {
		return nil, err
	}
	if t.failed != nil {
		return nil, t.failed
	}
	// The transaction opens with the view's first statement (Read's
	// batch), not a round trip of its own.
	return &pgTarget{q: t.conn, table: table, fail: t.fail, sql: newTargetSQL(table), tx: t}, nil
}

// Read implements checkpoint.Target.
func (g *pgTarget) Read(ctx context.Context, keys []string) (map[string]checkpoint.State, error) {
	keys = sortedUnique(keys)
	var rows pgx.Rows
	if g.tx != nil {
		// One round trip: BEGIN and the fence lock (when the transaction
		// is not open yet), the key locks of a table that creates missing
		// keys, and the locking read.
		b := g.tx.batch()
		if g.table.CreateMissing {
			b.Queue(sqlLockKeys, g.table.Name, keys)
		}
		b.Queue(g.sql.readLocked, keys)
		br, err := g.tx.send(b)
		if err != nil {
			return nil, err
		}
		defer br.Close()
		if g.table.CreateMissing {
			if _, err := br.Exec(); err != nil {
				return nil, g.fail(fmt.Errorf("postgres: lock the keys of %s: %w", g.table.Name, err))
			}
		}
		if rows, err = br.Query(); err != nil {
			return nil, g.fail(fmt.Errorf("postgres: read %s: %w", g.table.Name, err))
		}
	} else {
		var err error
		if rows, err = g.q.Query(ctx, g.sql.read, keys); err != nil {
			return nil, g.fail(fmt.Errorf("postgres: read %s: %w", g.table.Name, err))
		}
	}
	out := make(map[string]checkpoint.State, len(keys))
	for rows.Next() {
		var k string
		var s checkpoint.State
		if err := rows.Scan(&k, &s.Value, &s.Version); err != nil {
			rows.Close()
			return nil, g.fail(fmt.Errorf("postgres: read %s: %w", g.table.Name, err))
		}
		s.Exists = true
		out[k] = s
	}
	if err := rows.Err(); err != nil {
		return nil, g.fail(fmt.Errorf("postgres: read %s: %w", g.table.Name, err))
	}
	rows.Close()
	for _, k := range keys {
		if _, ok := out[k]; ok {
			continue
		}
		if !g.table.CreateMissing {
			return nil, fmt.Errorf("%w: %s has no key %q", checkpoint.ErrMissingKey, g.table.Name, k)
		}
		out[k] = checkpoint.State{}
	}
	return out, nil
}

// Write implements checkpoint.Target: one UPDATE for every existing key
// and one INSERT for the new ones, each returning the keys it wrote, so a
// key it missed (another writer moved it) is named.
func (g *pgTarget) Write(ctx context.Context, ws []checkpoint.Write) error {
	// In key order, so two writers of the same keys take their row locks
	// in one order and wait for each other instead of deadlocking.
	if err := g.begin(); err != nil {
		return err
	}
	ws = slices.Clone(ws)
	slices.SortFunc(ws, func(a, b checkpoint.Write) int { return strings.Compare(a.Key, b.Key) })
	for i := 1; i < len(ws); i++ {
		if ws[i].Key == ws[i-1].Key {
			return g.fail(fmt.Errorf("postgres: write %s: key %q is written twice in one plan", g.table.Name, ws[i].Key))
		}
	}
	var uk, ik []string
	var unv, uov, inv []int64
	for _, w := range ws {
		if w.Insert {
			ik, inv = append(ik, w.Key), append(inv, w.NewValue)
			continue
		}
		uk, unv, uov = append(uk, w.Key), append(unv, w.NewValue), append(uov, w.OldVersion)
	}
	written := make(map[string]bool, len(ws))
	for _, st := range []struct {
		q    string
		args []any
		n    int
	}{{g.sql.update, []any{uk, unv, uov}, len(uk)}, {g.sql.insert, []any{ik, inv}, len(ik)}} {
		if st.n == 0 {
			continue
		}
		rows, err := g.q.Query(ctx, st.q, st.args...)
		if err != nil {
			return g.fail(fmt.Errorf("postgres: write %s: %w", g.table.Name, err))
		}
		keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return g.fail(fmt.Errorf("postgres: write %s: %w", g.table.Name, err))
		}
		for _, k := range keys {
			written[k] = true
		}
	}
	if len(written) == len(ws) {
		return nil
	}
	// What matched is written in this transaction: it must not commit.
	return g.fail(g.conflict(ctx, ws, written))
}

// conflict names the first write, in the plan's order, that found its key
// moved: another writer changed (or created, or deleted) it first.
func (g *pgTarget) conflict(ctx context.Context, ws []checkpoint.Write, written map[string]bool) error {
	var missed []string
	for _, w := range ws {
		if !written[w.Key] {
			missed = append(missed, w.Key)
		}
	}
	rows, err := g.q.Query(ctx, g.sql.versions, missed)
	if err != nil {
		return g.fail(fmt.Errorf("postgres: read versions of %s after a missed compare-and-set: %w", g.table.Name, err))
	}
	found := map[string]int64{}
	for rows.Next() {
		var k string
		var v int64
		if err := rows.Scan(&k, &v); err != nil {
			rows.Close()
			return g.fail(err)
		}
		found[k] = v
	}
	if err := rows.Err(); err != nil {
		return g.fail(err)
	}
	for _, w := range ws {
		if written[w.Key] {
			continue
		}
		v, ok := found[w.Key]
		if !ok {
			v = -1
		}
		return &checkpoint.VersionConflictError{Table: g.table.Name, Key: w.Key, Expected: w.OldVersion, Found: v}
	}
	return nil
}

// IsApplied implements checkpoint.Target.
func (g *pgTarget) IsApplied(ctx context.Context, effectID string) (bool, error) {
	if err := g.begin(); err != nil {
		return false, err
	}
	rows, err := g.q.Query(ctx, sqlIsApplied, effectID)
	if err != nil {
		return false, g.fail(fmt.Errorf("postgres: look up applied effect %s: %w", effectID, err))
	}
	ok, err := pgx.CollectExactlyOneRow(rows, pgx.RowTo[bool])
	if err != nil {
		return false, g.fail(fmt.Errorf("postgres: look up applied effect %s: %w", effectID, err))
	}
	return ok, nil
}

// MarkApplied implements checkpoint.Target. An effect ID marked twice is
// an error (a unique key): a plan applies once.
func (g *pgTarget) MarkApplied(ctx context.Context, a checkpoint.Applied) error {
	if err := g.begin(); err != nil {
		return err
	}
	if _, err := g.q.Exec(ctx, sqlMarkApplied, a.EffectID, a.RunID, a.StepID, a.At); err != nil {
		return g.fail(fmt.Errorf("postgres: record applied effect %s: %w", a.EffectID, err))
	}
	return nil
}

// effectTarget is a target table opened by the store: today always in
// the store's own database (same store).
type effectTarget struct {
	s     *Store
	table checkpoint.Table
}

// OpenTarget implements checkpoint.Store. A table in the store's own
// database is the same store: its effects commit in the checkpoint's
// transaction (Tx.Target). Targets in another database are not supported
// by this store yet and are refused with a clear error.
func (s *Store) OpenTarget(ctx context.Context, spec checkpoint.TargetSpec) (checkpoint.EffectTarget, error) {
	if err := spec.Table.Validate(); err != nil {
		return nil, err
	}
	if spec.Location != "" {
		return nil, fmt.Errorf("postgres: effect target %s in %q: targets outside the checkpoint database (%s) are not supported by the PostgreSQL store yet",
			spec.Table.Name, redactURL(spec.Location), s.where)
	}
	// The table and its columns must exist: checked now, not at the first
	// chunk's commit.
	sq := newTargetSQL(spec.Table)
	rows, err := s.pool.Query(ctx, sq.read+` LIMIT 0`, []string{})
	if err == nil {
		rows.Close()
		err = rows.Err()
	}
	if err != nil {
		return nil, s.wrap("open effect target "+spec.Table.String(), err)
	}
	return &effectTarget{s: s, table: spec.Table}, nil
}

// Same implements checkpoint.EffectTarget.
func (e *effectTarget) Same() bool { return true }

// Update implements checkpoint.EffectTarget: a same-store target is
// written through Tx.Target, in the checkpoint's own transaction.
func (e *effectTarget) Update(ctx context.Context, fn func(checkpoint.Target) error) error {
	return fmt.Errorf("postgres: %s is in the checkpoint database: write it through the checkpoint transaction (Tx.Target)", e.table.Name)
}

// View implements checkpoint.EffectTarget: a read-only transaction that
// takes no row locks.
func (e *effectTarget) View(ctx context.Context, fn func(checkpoint.Target) error) error {
	tx, err := e.s.pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return e.s.wrap("read "+e.table.Name, err)
	}
	defer tx.Rollback(ctx)
	g := &pgTarget{q: tx, table: e.table, fail: func(err error) error { return err }, sql: newTargetSQL(e.table)}
	if err := fn(g); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// Close implements checkpoint.EffectTarget.
func (e *effectTarget) Close() error { return nil }

// redactURL is u with any password replaced, for messages.
func redactURL(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "(an unparsable location)"
	}
	return p.Redacted()
}

// sortedUnique is keys in bytewise order without repeats.
func sortedUnique(keys []string) []string {
	out := slices.Clone(keys)
	slices.Sort(out)
	return slices.Compact(out)
}

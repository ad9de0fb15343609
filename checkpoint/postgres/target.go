package postgres

import (
	"context"
	"database/sql"
	"errors"
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
// call, whatever the number of keys. In a write transaction its reads lock
// the rows they read (FOR UPDATE, in key order, so two writers touching
// the same keys wait for each other instead of deadlocking).
type pgTarget struct {
	q     querier
	table checkpoint.Table
	lock  bool
	// fail records a failed statement: it aborts a PostgreSQL transaction.
	fail func(error) error
	sql  targetSQL
	// mayLackApplied: the database may have no stepwise_applied (a
	// separate target opened read-only created none).
	mayLackApplied bool
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
	if err := t.open(); err != nil {
		return nil, err
	}
	return &pgTarget{q: t.conn, table: table, lock: true, fail: t.fail, sql: newTargetSQL(table)}, nil
}

// Read implements checkpoint.Target.
func (g *pgTarget) Read(ctx context.Context, keys []string) (map[string]checkpoint.State, error) {
	keys = sortedUnique(keys)
	q := g.sql.read
	if g.lock {
		q = g.sql.readLocked
		if g.table.CreateMissing {
			if _, err := g.q.Exec(ctx, sqlLockKeys, g.table.Name, keys); err != nil {
				return nil, g.fail(fmt.Errorf("postgres: lock the keys of %s: %w", g.table.Name, err))
			}
		}
	}
	rows, err := g.q.Query(ctx, q, keys)
	if err != nil {
		return nil, g.fail(fmt.Errorf("postgres: read %s: %w", g.table.Name, err))
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
	if g.mayLackApplied {
		return g.isAppliedMaybeMissing(ctx, effectID)
	}
	return g.isApplied(ctx, effectID)
}

// isApplied looks effectID up in stepwise_applied.
func (g *pgTarget) isApplied(ctx context.Context, effectID string) (bool, error) {
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
	if _, err := g.q.Exec(ctx, sqlMarkApplied, a.EffectID, a.RunID, a.StepID, a.At); err != nil {
		return g.fail(fmt.Errorf("postgres: record applied effect %s: %w", a.EffectID, err))
	}
	return nil
}

// effectTarget is a target table in the store's own database (same
// store).
type effectTarget struct {
	s     *Store
	table checkpoint.Table
}

// OpenTarget implements checkpoint.Store. An empty Location is the
// store's own database. A postgres:// or postgresql:// Location is the
// same store when it reaches the same database and the table resolves to
// the same relation there (see sameStore), whatever its spelling; its
// effects then commit in the checkpoint's transaction (Tx.Target).
// Otherwise it is a separate target, opened with the store's settings
// (see OpenDatabaseTarget). Any other location (a SQLite file path) is
// opened by Config.Targets.
func (s *Store) OpenTarget(ctx context.Context, spec checkpoint.TargetSpec) (checkpoint.EffectTarget, error) {
	if err := spec.Table.Validate(); err != nil {
		return nil, err
	}
	if spec.Location == "" {
		return s.openSameTarget(ctx, spec)
	}
	if !IsURL(spec.Location) {
		if s.cfg.Targets == nil {
			return nil, fmt.Errorf("postgres: effect target %s in %q: the PostgreSQL store opens postgres:// URLs only, and no opener for other locations was configured (Config.Targets)",
				spec.Table.Name, spec.Location)
		}
		return s.cfg.Targets(ctx, spec)
	}
	cfg := s.cfg
	cfg.URL = spec.Location
	d, err := openDatabase(ctx, cfg, spec)
	if err != nil {
		return nil, err
	}
	same, err := s.sameStore(ctx, d, spec.Table)
	if err != nil {
		d.pool.Close()
		return nil, err
	}
	if same {
		d.pool.Close()
		return s.openSameTarget(ctx, spec)
	}
	if err := d.prepare(ctx); err != nil {
		d.pool.Close()
		return nil, err
	}
	return d, nil
}

// openSameTarget opens a table of the store's own database.
func (s *Store) openSameTarget(ctx context.Context, spec checkpoint.TargetSpec) (checkpoint.EffectTarget, error) {
	// The table and its columns must exist: checked now, not at the first
	// chunk's commit.
	if err := checkTableExists(ctx, s.pool, spec.Table); err != nil {
		return nil, s.wrap("open effect target "+spec.Table.String(), err)
	}
	return &effectTarget{s: s, table: spec.Table}, nil
}

// checkTableExists reads no row of t, which fails unless the table and
// its columns exist.
func checkTableExists(ctx context.Context, q querier, t checkpoint.Table) error {
	rows, err := q.Query(ctx, newTargetSQL(t).read+` LIMIT 0`, []string{})
	if err == nil {
		rows.Close()
		err = rows.Err()
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case codeUndefinedTable:
			return fmt.Errorf("effect target table %q does not exist (under the URL's search_path); create it with columns %s: %w", t.Name, t, err)
		case codeUndefinedColumn:
			return fmt.Errorf("effect target table %q lacks a column (%s); want %s: %w", t.Name, pe.Message, t, err)
		}
	}
	return err
}

// ReadDB returns read-only database/sql connections to the store's
// database, for job code that reads its own tables (the store's ReadDB).
func (e *effectTarget) ReadDB() *sql.DB { return e.s.rdb }

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

// IsURL reports whether loc is a PostgreSQL URL (postgres:// or
// postgresql://, in any case): a location this backend opens itself.
func IsURL(loc string) bool {
	scheme, _, ok := strings.Cut(loc, "://")
	return ok && (strings.EqualFold(scheme, "postgres") || strings.EqualFold(scheme, "postgresql"))
}

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

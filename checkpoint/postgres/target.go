package postgres

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stepwise-run/stepwise/checkpoint"
)

// querier is what a check at open runs its statements on: a pool or a
// connection.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// pgTarget is the set-based view of one target table: one round trip per
// call, whatever the number of keys (the statements of a call go in one
// batch, and in the checkpoint's transaction BEGIN and the fence check go
// ahead of the first). In a write transaction its reads lock the rows
// they read (FOR UPDATE, in key order, so two writers touching the same
// keys wait for each other instead of deadlocking).
type pgTarget struct {
	table checkpoint.Table
	lock  bool
	// send sends a batch: through the checkpoint transaction (pgTx.send)
	// or a transaction of the target's own (pgx.Tx.SendBatch).
	send func(*pgx.Batch) (pgx.BatchResults, error)
	// fail records a failed statement: it aborts a PostgreSQL transaction.
	fail func(error) error
	sql  *targetSQL
	// pend, when not nil, queues a statement in the checkpoint
	// transaction, to be sent ahead of the next one that needs results or
	// with COMMIT (pgTx.pend); it returns false when the transaction is
	// not open, and the statement is to be sent now.
	pend func(q *pgx.QueuedQuery, explain func(error) error) bool
	// mayLackApplied: the database may have no stepwise_applied (a
	// separate target opened read-only created none).
	mayLackApplied bool
	// lockEffects: a separate target's write transaction. IsApplied and
	// MarkApplied first take a transaction-scoped advisory lock on the
	// effect ID, so two runners finishing one recorded plan (one that lost
	// its lease, and the new owner) serialise: the second waits for the
	// first's commit and then sees its mark. Without it, under READ
	// COMMITTED the second would see the effect unapplied, then meet the
	// first's writes as a version conflict, and the protocol would plan
	// and apply the effect again. (In the checkpoint's own transaction the
	// fence lock on the run row serialises them already.)
	lockEffects bool
}

// txTarget is a pgTarget running in tx, a transaction of the target's own.
func txTarget(ctx context.Context, tx pgx.Tx, table checkpoint.Table, sq *targetSQL, lock bool, fail func(error) error) *pgTarget {
	return &pgTarget{table: table, lock: lock, sql: sq, fail: fail,
		send: func(b *pgx.Batch) (pgx.BatchResults, error) { return tx.SendBatch(ctx, b), nil },
	}
}

// targetSQL holds a table's statements, built once from its validated
// (and quoted) identifiers; values are always parameters.
type targetSQL struct {
	read, readLocked, versions, update, insert string
	// lockRows locks the rows of the keys $1 in bytewise key order, the
	// one global order every writer of the table takes them in: an
	// UPDATE ... FROM unnest(...) locks rows in whatever order its join
	// visits them, so two of them on overlapping keys could deadlock.
	lockRows string
	// cas is update and insert in one statement that raises codeRefused
	// when a key was missed, naming in its message (see parseCASRefusal)
	// the first missed key in bytewise order, its expected version and
	// the version found (-1: missing).
	cas string
	// readLocked1, cas1Update and cas1Insert are readLocked and cas for
	// one key, in scalar parameters: the common effect step touches one
	// key, and the array forms cost the server several times the work
	// (unnest, the hashed NOT IN of the refusal) for it. Same locks, same
	// refusal message.
	readLocked1, cas1Update, cas1Insert string
}

func newTargetSQL(t checkpoint.Table) *targetSQL {
	name := pgx.Identifier{t.Name}.Sanitize()
	key := pgx.Identifier{t.Key}.Sanitize()
	val := pgx.Identifier{t.Value}.Sanitize()
	ver := pgx.Identifier{t.Version}.Sanitize()
	read := `SELECT ` + key + `, ` + val + `, ` + ver + ` FROM ` + name + ` WHERE ` + key + ` = ANY($1) ORDER BY ` + key
	// refused1 raises codeRefused for the one key $1 expected at version
	// $3, in cas's message format, when the CTE w wrote no row.
	refused1 := `SELECT CASE WHEN (SELECT count(*) FROM w) = 1 THEN 1 ELSE stepwise_expect_rows(0, 1, json_build_array($1::text, $3::bigint,
    coalesce((SELECT t.` + ver + ` FROM ` + name + ` AS t WHERE t.` + key + ` = $1), -1))::text) END`
	return &targetSQL{
		read:        read,
		readLocked:  read + ` FOR UPDATE`,
		readLocked1: `SELECT ` + key + `, ` + val + `, ` + ver + ` FROM ` + name + ` WHERE ` + key + ` = $1 FOR UPDATE`,
		cas1Update: `WITH w AS (UPDATE ` + name + ` SET ` + val + ` = $2, ` + ver + ` = $3 + 1 WHERE ` + key + ` = $1 AND ` + ver + ` = $3 RETURNING 1)
` + refused1,
		cas1Insert: `WITH w AS (INSERT INTO ` + name + ` (` + key + `, ` + val + `, ` + ver + `) VALUES ($1, $2, 1)
    ON CONFLICT (` + key + `) DO NOTHING RETURNING 1)
` + refused1,
		lockRows: `SELECT ` + key + ` FROM ` + name + ` WHERE ` + key + ` = ANY($1) ORDER BY ` + key + ` COLLATE "C" FOR UPDATE`,
		versions: `SELECT ` + key + `, ` + ver + ` FROM ` + name + ` WHERE ` + key + ` = ANY($1)`,
		update: `UPDATE ` + name + ` AS t SET ` + val + ` = u.nv, ` + ver + ` = u.ov + 1
FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS u(k, nv, ov)
WHERE t.` + key + ` = u.k AND t.` + ver + ` = u.ov
RETURNING t.` + key,
		insert: `INSERT INTO ` + name + ` (` + key + `, ` + val + `, ` + ver + `)
SELECT u.k, u.nv, 1 FROM unnest($1::text[], $2::bigint[]) AS u(k, nv)
ON CONFLICT (` + key + `) DO NOTHING
RETURNING ` + key,
		cas: `WITH up AS (UPDATE ` + name + ` AS t SET ` + val + ` = u.nv, ` + ver + ` = u.ov + 1
    FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS u(k, nv, ov)
    WHERE t.` + key + ` = u.k AND t.` + ver + ` = u.ov
    RETURNING t.` + key + ` AS k),
ins AS (INSERT INTO ` + name + ` (` + key + `, ` + val + `, ` + ver + `)
    SELECT u.k, u.nv, 1 FROM unnest($4::text[], $5::bigint[]) AS u(k, nv)
    ON CONFLICT (` + key + `) DO NOTHING
    RETURNING ` + key + ` AS k),
n AS (SELECT (SELECT count(*) FROM up) + (SELECT count(*) FROM ins) AS got)
SELECT CASE WHEN n.got = $7 THEN n.got ELSE stepwise_expect_rows(n.got, $7, (
    SELECT json_build_array(m.k, m.ov, coalesce((SELECT t.` + ver + ` FROM ` + name + ` AS t WHERE t.` + key + ` = m.k), -1))::text
    FROM (SELECT a.k, a.ov FROM unnest($1::text[], $3::bigint[]) AS a(k, ov) WHERE a.k NOT IN (SELECT k FROM up)
        UNION ALL
        SELECT b.k, b.ov FROM unnest($4::text[], $6::bigint[]) AS b(k, ov) WHERE b.k NOT IN (SELECT k FROM ins)) AS m
    ORDER BY m.k COLLATE "C" LIMIT 1)) END
FROM n`,
	}
}

// targetSQL returns t's statements, built once per store.
func (s *Store) targetSQL(t checkpoint.Table) *targetSQL {
	if sq, ok := s.tsql.Load(t); ok {
		return sq.(*targetSQL)
	}
	sq, _ := s.tsql.LoadOrStore(t, newTargetSQL(t))
	return sq.(*targetSQL)
}

const (
	// sqlLockKeys takes a transaction-scoped advisory lock per key of a
	// table that creates missing keys, in key order: FOR UPDATE locks only
	// rows that exist, so two writers of one new key would both read it
	// missing and one would find the other's insert at its commit.
	sqlLockKeys = `SELECT pg_advisory_xact_lock(s.h) FROM (
    SELECT hashtextextended($1 || chr(31) || k, 0) AS h FROM unnest($2::text[]) AS k ORDER BY k COLLATE "C") AS s`
	// sqlLockKey is sqlLockKeys for one key $2: the same lock.
	sqlLockKey = `SELECT pg_advisory_xact_lock(hashtextextended($1 || chr(31) || $2::text, 0))`
	// sqlLockEffect serialises the transactions that check or mark one
	// effect ID on a separate target, until each commits.
	sqlLockEffect  = `SELECT pg_advisory_xact_lock(hashtextextended('stepwise effect ' || $1, 0))`
	sqlIsApplied   = `SELECT EXISTS (SELECT 1 FROM stepwise_applied WHERE effect_id = $1)`
	sqlMarkApplied = `INSERT INTO stepwise_applied (effect_id, run_id, step_id, applied_at) VALUES ($1, $2, $3, $4)`
)

// Target implements checkpoint.Tx: the table, in the checkpoint database,
// written in this transaction. The transaction opens (and the fence is
// checked) with the view's first statement, in its round trip, after the
// writes made before the view: a fenced attempt's reads and writes roll
// back with the transaction.
func (t *pgTx) Target(table checkpoint.Table) (checkpoint.Target, error) {
	if err := table.Validate(); err != nil {
		return nil, err
	}
	if t.failed != nil {
		return nil, t.failed
	}
	pend := func(q *pgx.QueuedQuery, explain func(error) error) bool {
		if !t.pipelining() {
			return false
		}
		t.pend(q, explain)
		return true
	}
	return &pgTarget{table: table, lock: true, send: t.send, fail: t.fail, pend: pend, sql: t.s.targetSQL(table)}, nil
}

// finish closes br and returns the first of err and br's error, recorded
// as the transaction's failure.
func (g *pgTarget) finish(br pgx.BatchResults, err error) error {
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return g.fail(err)
	}
	return nil
}

// Read implements checkpoint.Target: one round trip (the key locks and
// the read in one batch).
func (g *pgTarget) Read(ctx context.Context, keys []string) (map[string]checkpoint.State, error) {
	keys = sortedUnique(keys)
	b := &pgx.Batch{}
	q := g.sql.read
	var arg any = keys
	lockKeys := false
	if g.lock {
		q = g.sql.readLocked
		if len(keys) == 1 {
			q, arg = g.sql.readLocked1, keys[0]
		}
		if g.table.CreateMissing {
			if len(keys) == 1 {
				b.Queue(sqlLockKey, g.table.Name, keys[0])
			} else {
				b.Queue(sqlLockKeys, g.table.Name, keys)
			}
			lockKeys = true
		}
	}
	b.Queue(q, arg)
	br, err := g.send(b)
	if err != nil {
		return nil, g.fail(fmt.Errorf("postgres: read %s: %w", g.table.Name, err))
	}
	if lockKeys {
		if _, err := br.Exec(); err != nil {
			return nil, g.finish(br, fmt.Errorf("postgres: lock the keys of %s: %w", g.table.Name, err))
		}
	}
	out := make(map[string]checkpoint.State, len(keys))
	rows, err := br.Query()
	if err == nil {
		for rows.Next() {
			var k string
			var s checkpoint.State
			if err = rows.Scan(&k, &s.Value, &s.Version); err != nil {
				break
			}
			s.Exists = true
			out[k] = s
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	if err != nil {
		err = fmt.Errorf("postgres: read %s: %w", g.table.Name, err)
	}
	if err := g.finish(br, err); err != nil {
		return nil, err
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
// and one INSERT for the new ones, in one round trip, each returning the
// keys it wrote, so a key it missed (another writer moved it) is named.
// In the checkpoint's transaction once it is open, it is instead one
// statement sent with the next round trip (targetSQL.cas), and Write
// returns nil: a conflict is that next call's, or InTx's, error.
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
	uk, unv, uov, ik, inv, iov := splitWrites(ws)
	if len(ws) == 0 {
		return nil
	}
	if g.pend != nil {
		// In the open checkpoint transaction: one statement, sent with
		// the next round trip; a missed key aborts the transaction.
		q := &pgx.QueuedQuery{SQL: g.sql.cas, Arguments: []any{uk, unv, uov, ik, inv, iov, len(ws)}}
		if w := ws[0]; len(ws) == 1 && w.Insert {
			q = &pgx.QueuedQuery{SQL: g.sql.cas1Insert, Arguments: []any{w.Key, w.NewValue, w.OldVersion}}
		} else if len(ws) == 1 {
			q = &pgx.QueuedQuery{SQL: g.sql.cas1Update, Arguments: []any{w.Key, w.NewValue, w.OldVersion}}
		}
		if g.pend(q, g.explainCAS) {
			return nil
		}
	}
	b := &pgx.Batch{}
	queued := 0
	// Outside the checkpoint's transaction (a separate target) nothing
	// locked the rows yet: lock them in key order first, so partitions
	// writing overlapping accounts wait for each other instead of
	// deadlocking.
	lockFirst := g.lock && len(uk) > 1
	if lockFirst {
		b.Queue(g.sql.lockRows, uk)
	}
	if len(uk) > 0 {
		b.Queue(g.sql.update, uk, unv, uov)
		queued++
	}
	if len(ik) > 0 {
		b.Queue(g.sql.insert, ik, inv)
		queued++
	}
	br, err := g.send(b)
	if err != nil {
		return g.fail(fmt.Errorf("postgres: write %s: %w", g.table.Name, err))
	}
	written := make(map[string]bool, len(ws))
	if lockFirst {
		if _, lerr := br.Exec(); lerr != nil {
			err, queued = fmt.Errorf("postgres: lock %s rows in key order: %w", g.table.Name, lerr), 0
		}
	}
	for range queued {
		var keys []string
		rows, qerr := br.Query()
		if qerr == nil {
			keys, qerr = pgx.CollectRows(rows, pgx.RowTo[string])
		}
		if qerr != nil {
			err = fmt.Errorf("postgres: write %s: %w", g.table.Name, qerr)
			break
		}
		for _, k := range keys {
			written[k] = true
		}
	}
	if err := g.finish(br, err); err != nil {
		return err
	}
	if len(written) == len(ws) {
		return nil
	}
	// What matched is written in this transaction: it must not commit.
	return g.fail(g.conflict(ws, written))
}

// splitWrites splits writes into the updates' keys, new values and old
// versions and the inserts' keys, new values and old versions: the array
// arguments of Write's statements.
func splitWrites(ws []checkpoint.Write) (uk []string, unv, uov []int64, ik []string, inv, iov []int64) {
	for _, w := range ws {
		if w.Insert {
			ik, inv, iov = append(ik, w.Key), append(inv, w.NewValue), append(iov, w.OldVersion)
			continue
		}
		uk, unv, uov = append(uk, w.Key), append(unv, w.NewValue), append(uov, w.OldVersion)
	}
	return uk, unv, uov, ik, inv, iov
}

// explainCAS turns the error of targetSQL.cas into Write's: a refusal
// into the *checkpoint.VersionConflictError its message names.
func (g *pgTarget) explainCAS(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == codeRefused {
		if vc, ok := parseCASRefusal(g.table.Name, pe.Message); ok {
			return vc
		}
	}
	return fmt.Errorf("postgres: write %s: %w", g.table.Name, err)
}

// parseCASRefusal reads the conflict in the message stepwise_expect_rows
// raised for targetSQL.cas: `[key, expected, found]: wrote n of m rows`.
func parseCASRefusal(table, msg string) (*checkpoint.VersionConflictError, bool) {
	i := strings.LastIndex(msg, ": wrote ")
	if i < 0 {
		return nil, false
	}
	var parts []json.RawMessage
	if err := json.Unmarshal([]byte(msg[:i]), &parts); err != nil || len(parts) != 3 {
		return nil, false
	}
	vc := &checkpoint.VersionConflictError{Table: table}
	if json.Unmarshal(parts[0], &vc.Key) != nil || json.Unmarshal(parts[1], &vc.Expected) != nil ||
		json.Unmarshal(parts[2], &vc.Found) != nil {
		return nil, false
	}
	return vc, true
}

// conflict names the first write, in the plan's order, that found its key
// moved: another writer changed (or created, or deleted) it first.
func (g *pgTarget) conflict(ws []checkpoint.Write, written map[string]bool) error {
	var missed []string
	for _, w := range ws {
		if !written[w.Key] {
			missed = append(missed, w.Key)
		}
	}
	b := &pgx.Batch{}
	b.Queue(g.sql.versions, missed)
	br, err := g.send(b)
	if err != nil {
		return err
	}
	found := map[string]int64{}
	rows, err := br.Query()
	if err == nil {
		for rows.Next() {
			var k string
			var v int64
			if err = rows.Scan(&k, &v); err != nil {
				break
			}
			found[k] = v
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	if err := g.finish(br, err); err != nil {
		return fmt.Errorf("postgres: read versions of %s after a missed compare-and-set: %w", g.table.Name, err)
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
	b := &pgx.Batch{}
	if g.mayLackApplied {
		// A read-only separate target created no stepwise_applied: a
		// missing one holds nothing. The lookup cannot name a table that
		// may not exist, so it waits for the answer.
		b.Queue(sqlHasApplied)
		ok, err := g.bool(b, "look for stepwise_applied", 0)
		if err != nil || !ok {
			return false, err
		}
		b = &pgx.Batch{}
	}
	skip := 0
	if g.lockEffects {
		// The lock, then the lookup: a statement of its own, so under
		// READ COMMITTED it reads a snapshot taken after the lock was
		// granted (the other runner's commit included).
		b.Queue(sqlLockEffect, effectID)
		skip = 1
	}
	b.Queue(sqlIsApplied, effectID)
	return g.bool(b, "look up applied effect "+effectID, skip)
}

// bool sends b, whose last query returns one boolean after skip
// statements whose results are not read.
func (g *pgTarget) bool(b *pgx.Batch, op string, skip int) (bool, error) {
	br, err := g.send(b)
	if err != nil {
		return false, g.fail(fmt.Errorf("postgres: %s: %w", op, err))
	}
	for range skip {
		if _, err := br.Exec(); err != nil {
			return false, g.finish(br, fmt.Errorf("postgres: %s: %w", op, err))
		}
	}
	var ok bool
	err = br.QueryRow().Scan(&ok)
	if err != nil {
		err = fmt.Errorf("postgres: %s: %w", op, err)
	}
	return ok, g.finish(br, err)
}

// MarkApplied implements checkpoint.Target. An effect ID marked twice is
// an error (a unique key): a plan applies once.
func (g *pgTarget) MarkApplied(ctx context.Context, a checkpoint.Applied) error {
	b := &pgx.Batch{}
	if g.lockEffects {
		b.Queue(sqlLockEffect, a.EffectID) // held already if IsApplied ran: locks stack
	}
	b.Queue(sqlMarkApplied, a.EffectID, a.RunID, a.StepID, a.At)
	br, err := g.send(b)
	if err == nil {
		for range b.Len() {
			if _, err = br.Exec(); err != nil {
				break
			}
		}
		err = g.finish(br, err)
	}
	if err != nil {
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
	g := txTarget(ctx, tx, e.table, e.s.targetSQL(e.table), false, func(err error) error { return err })
	if err := fn(g); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// Close implements checkpoint.EffectTarget.
func (e *effectTarget) Close() error { return nil }

// IsURL reports whether loc is a PostgreSQL URL (postgres:// or
// postgresql://, in any case): a location this backend opens itself.
func IsURL(loc string) bool { return checkpoint.IsPostgresURL(loc) }

// redactURL is u with any password replaced, for messages.
func redactURL(u string) string { return checkpoint.RedactLocation(u) }

// sortedUnique is keys in bytewise order without repeats.
func sortedUnique(keys []string) []string {
	out := slices.Clone(keys)
	slices.Sort(out)
	return slices.Compact(out)
}

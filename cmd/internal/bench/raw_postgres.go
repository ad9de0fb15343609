package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/postgres"
	"github.com/stepwise-run/stepwise/examples/settlement"
	"github.com/stepwise-run/stepwise/jobs"
)

// This file is the PostgreSQL backend of the benchmark: every side of
// every workload gets a fresh schema in the database Config.DB names
// (CREATE SCHEMA, search_path in the URL), dropped at the end. The raw
// baselines are pgx used natively, as a careful engineer writes it:
// statements cached and prepared by pgx, BEGIN pipelined with the first
// query (pgx.Batch), set-based chunks with unnest arrays. Their tables are
// made by the store's own migrations (a postgres.Store opened on the raw
// schema) and they run on that store's pool, so the tables and the pool
// settings are the store's.

const (
	sqlPGRawStep = `INSERT INTO steps (run_id, step_id, status, output, input_hash, error, tries, attempt, started_at, finished_at)
VALUES ($1, $2, 'completed', $3, '', '', 1, 1, $4, $5)`
	sqlPGRawStepCount = `SELECT count(*) FROM steps WHERE run_id = $1`
	sqlPGRawStateRead = `SELECT value, version FROM stepwise_state WHERE key = $1`
	sqlPGRawStateCAS  = `UPDATE stepwise_state SET value = $1, version = $2 WHERE key = $3 AND version = $4`
	sqlPGRawTransfers = `SELECT id, from_account, to_account, amount FROM transfers WHERE business_date = $1 AND id > $2 ORDER BY id LIMIT $3`
	sqlPGRawAccounts  = `SELECT id, balance, version FROM accounts WHERE id = ANY($1)`
	sqlPGRawAccCAS    = `UPDATE accounts AS a SET balance = u.balance, version = u.version + 1
FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS u(id, balance, version)
WHERE a.id = u.id AND a.version = u.version`
	sqlPGRawItems = `INSERT INTO items (run_id, step_id, item_key, status, output, error, attempt, chunk)
SELECT $1, 'post', u.key, u.status, u.output, u.error, 1, '' FROM unnest($2::text[], $3::text[], $4::bytea[], $5::text[]) AS u(key, status, output, error)`
	sqlPGRawItemKeys = `SELECT item_key, status FROM items WHERE run_id = $1 AND step_id = 'post'`
	sqlPGRawRejected = `SELECT count(*) FROM items WHERE status = 'rejected'`
	// The queue-claim baseline's table, claim, finish and count.
	sqlPGRawQueueTable = `CREATE TABLE raw_queue (
    id           text COLLATE "C" PRIMARY KEY,
    status       text NOT NULL,
    priority     integer NOT NULL DEFAULT 0,
    available_at timestamptz NOT NULL,
    owner        text,
    lease_until  timestamptz,
    attempts     integer NOT NULL DEFAULT 0
);
CREATE INDEX raw_queue_due ON raw_queue (priority DESC, available_at, id) WHERE status = 'queued'`
	sqlPGRawQueueSeed = `INSERT INTO raw_queue (id, status, available_at)
SELECT 'bench/' || lpad(i::text, 6, '0'), 'queued', now() - interval '1 second' FROM generate_series(0, $1 - 1) AS i`
	sqlPGRawClaim = `UPDATE raw_queue SET status = 'running', owner = $1, lease_until = now() + interval '1 minute', attempts = attempts + 1
WHERE id = (SELECT id FROM raw_queue WHERE status = 'queued' AND available_at <= now()
            ORDER BY priority DESC, available_at, id LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id`
	sqlPGRawFinish = `UPDATE raw_queue SET status = 'done', owner = NULL, lease_until = NULL WHERE id = $1 AND status = 'running'`
	sqlPGRawDone   = `SELECT count(*) FROM raw_queue WHERE status = 'done'`
)

// postgresBackend makes and drops the benchmark's schemas.
type postgresBackend struct {
	base    *url.URL
	shown   string // server and database, no password
	prefix  string // of every schema this run makes
	schemas []string
	stores  []*postgres.Store
}

func newPostgres(ctx context.Context, cfg Config) (*postgresBackend, error) {
	u, err := url.Parse(cfg.DB)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return nil, fmt.Errorf("%w: the database is not a postgres:// URL", ErrBadConfig)
	}
	var r [4]byte
	if _, err := rand.Read(r[:]); err != nil {
		return nil, err
	}
	p := &postgresBackend{base: u, prefix: "stepwise_bench_" + hex.EncodeToString(r[:]) + "_",
		shown: fmt.Sprintf("server %s, database %s", u.Host, strings.TrimPrefix(u.Path, "/"))}
	// Fail now, naming the server, if it cannot be reached.
	conn, err := p.connect(ctx)
	if err != nil {
		return nil, err
	}
	conn.Close(ctx)
	return p, nil
}

func (p *postgresBackend) kind() string                  { return StorePostgres }
func (p *postgresBackend) where() string                 { return p.shown }
func (p *postgresBackend) durability(sync string) string { return "synchronous_commit=" + sync }
func (p *postgresBackend) goals() goals                  { return postgresGoals }
func (p *postgresBackend) chunkNote() string {
	return "raw: per chunk one transaction: the page of transfers, one read of its accounts (= ANY), one version-CAS UPDATE and one item INSERT from unnest arrays"
}

// connect opens one connection on the base URL, with the store's errors.
func (p *postgresBackend) connect(ctx context.Context) (*pgx.Conn, error) {
	db, err := postgres.OpenDB(ctx, postgres.Config{URL: p.base.String(), MaxConns: 1})
	if err != nil {
		return nil, err
	}
	db.Close()
	return pgx.Connect(ctx, p.base.String())
}

func (p *postgresBackend) synchronous(ctx context.Context) string {
	conn, err := p.connect(ctx)
	if err != nil {
		return "unknown"
	}
	defer conn.Close(ctx)
	var s string
	if err := conn.QueryRow(ctx, "SHOW synchronous_commit").Scan(&s); err != nil {
		return "unknown"
	}
	return s
}

// schema creates a fresh schema and returns a URL whose search_path is it.
func (p *postgresBackend) schema(ctx context.Context, name string) (string, string, error) {
	conn, err := p.connect(ctx)
	if err != nil {
		return "", "", err
	}
	defer conn.Close(ctx)
	schema := p.prefix + name
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return "", "", fmt.Errorf("create schema %s in %s: %w", schema, p.shown, err)
	}
	p.schemas = append(p.schemas, schema)
	return p.schemaURL(schema), schema, nil
}

// schemaURL is the base URL with search_path set to schema. Spaces in
// the other parameters (options=-c x=y) stay %20: pgx reads no "+".
func (p *postgresBackend) schemaURL(schema string) string {
	u := *p.base
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20")
	return u.String()
}

// open opens a store on a fresh schema: its migrations make the tables.
func (p *postgresBackend) open(ctx context.Context, name string) (*postgres.Store, string, error) {
	return p.openConns(ctx, name, 0)
}

// openConns is open with a pool of conns connections (0: the default).
func (p *postgresBackend) openConns(ctx context.Context, name string, conns int32) (*postgres.Store, string, error) {
	u, schema, err := p.schema(ctx, name)
	if err != nil {
		return nil, "", err
	}
	st, err := postgres.Open(ctx, postgres.Config{URL: u, MaxConns: conns})
	if err != nil {
		return nil, "", err
	}
	p.stores = append(p.stores, st)
	return st, schema, nil
}

// close closes every store and drops every schema this run made.
func (p *postgresBackend) close(ctx context.Context) error {
	for _, st := range p.stores {
		st.Close()
	}
	p.stores = nil
	if len(p.schemas) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	conn, err := p.connect(ctx)
	if err != nil {
		return fmt.Errorf("drop the schemas %s*: %w", p.prefix, err)
	}
	defer conn.Close(ctx)
	var errs []error
	for _, s := range p.schemas {
		if _, err := conn.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{s}.Sanitize()+" CASCADE"); err != nil {
			errs = append(errs, fmt.Errorf("drop schema %s: %w", s, err))
		}
	}
	p.schemas = nil
	return errors.Join(errs...)
}

func (p *postgresBackend) store(ctx context.Context, name string) (*store, error) {
	st, _, err := p.open(ctx, name)
	if err != nil {
		return nil, err
	}
	// ReadDB is read-only: the benchmark's own set-up writes through
	// database/sql over the store's pool.
	return &store{Backend: st, db: stdlib.OpenDBFromPool(st.Pool()), read: st.ReadDB()}, nil
}

// rawPool opens the raw side's schema with the store's tables and pool.
func (p *postgresBackend) rawPool(ctx context.Context, name string) (*pgxpool.Pool, string, error) {
	st, schema, err := p.open(ctx, name+"_raw")
	if err != nil {
		return nil, "", err
	}
	return st.Pool(), schema, nil
}

// pgTx runs fn in one transaction on one connection of pool: BEGIN goes
// in one round trip with first (the transaction's first query, whose
// results read reads), fn sends the rest, then COMMIT.
func pgTx(ctx context.Context, pool *pgxpool.Pool, first func(*pgx.Batch), read func(pgx.BatchResults) error, fn func(*pgx.Conn) error) error {
	c, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	conn := c.Conn()
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	first(b)
	br := conn.SendBatch(ctx, b)
	_, err = br.Exec()
	if err == nil {
		err = read(br)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = fn(conn)
	}
	if err == nil {
		_, err = conn.Exec(ctx, "COMMIT")
	}
	if err != nil {
		conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
	}
	return err
}

// pgSteps is the per-step baseline: one autocommit single-row INSERT.
type pgSteps struct{ pool *pgxpool.Pool }

func (p *postgresBackend) rawSteps(ctx context.Context, name string, _ *store) (rawSteps, error) {
	pool, _, err := p.rawPool(ctx, name)
	return &pgSteps{pool: pool}, err
}

func (r *pgSteps) insert(ctx context.Context, runID, id string, output []byte) error {
	now := time.Now()
	_, err := r.pool.Exec(ctx, sqlPGRawStep, runID, id, output, now, now)
	return err
}

func (r *pgSteps) count(ctx context.Context, runID string) (int, error) {
	var n int
	err := r.pool.QueryRow(ctx, sqlPGRawStepCount, runID).Scan(&n)
	return n, err
}

// pgEffects is the per-step effect baseline: BEGIN and the read in one
// round trip, the CAS and the checkpoint insert in the next, COMMIT.
type pgEffects struct{ pool *pgxpool.Pool }

func (p *postgresBackend) rawEffects(ctx context.Context, name string, _ *store, keys []string) (rawEffects, error) {
	pool, _, err := p.rawPool(ctx, name)
	if err != nil {
		return nil, err
	}
	_, err = pool.Exec(ctx, `INSERT INTO stepwise_state (key, value, version) SELECT k, 0, 0 FROM unnest($1::text[]) AS k`, keys)
	return &pgEffects{pool: pool}, err
}

func (r *pgEffects) step(ctx context.Context, runID, id, key string, output []byte) error {
	var value, version int64
	first := func(b *pgx.Batch) { b.Queue(sqlPGRawStateRead, key) }
	return pgTx(ctx, r.pool, first, func(br pgx.BatchResults) error {
		return br.QueryRow().Scan(&value, &version)
	}, func(conn *pgx.Conn) error {
		now := time.Now()
		b := &pgx.Batch{}
		b.Queue(sqlPGRawStateCAS, value+1, version+1, key, version)
		b.Queue(sqlPGRawStep, runID, id, output, now, now)
		br := conn.SendBatch(ctx, b)
		tag, err := br.Exec()
		if err == nil && tag.RowsAffected() != 1 {
			err = fmt.Errorf("raw: the version of %s moved", key)
		}
		if err == nil {
			_, err = br.Exec()
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		return err
	})
}

func (r *pgEffects) stateSum(ctx context.Context) (int64, error) {
	var n int64
	err := r.pool.QueryRow(ctx, sqlStateSum).Scan(&n)
	return n, err
}

// settleSides seeds ours's ledger in the store's schema (settlement.Seed
// on postgres.OpenDB) and copies it into the raw side's schema (LIKE ...
// INCLUDING ALL: the same columns, collations, keys and indexes), then
// analyses both.
func (p *postgresBackend) settleSides(ctx context.Context, name string, seed seedFunc) (*store, rawSettler, error) {
	st, schema, err := p.open(ctx, name)
	if err != nil {
		return nil, nil, err
	}
	db, err := postgres.OpenDB(ctx, postgres.Config{URL: p.schemaURL(schema)})
	if err != nil {
		return nil, nil, err
	}
	err = seed(ctx, db)
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, nil, err
	}
	pool, rawSchema, err := p.rawPool(ctx, name)
	if err != nil {
		return nil, nil, err
	}
	from, to := pgx.Identifier{schema}.Sanitize(), pgx.Identifier{rawSchema}.Sanitize()
	for _, t := range []string{"accounts", "transfers", "opening_balances"} {
		for _, q := range []string{
			fmt.Sprintf("CREATE TABLE %s.%s (LIKE %s.%s INCLUDING ALL)", to, t, from, t),
			fmt.Sprintf("INSERT INTO %s.%s SELECT * FROM %s.%s", to, t, from, t),
			fmt.Sprintf("ANALYZE %s.%s", to, t),
			fmt.Sprintf("ANALYZE %s.%s", from, t),
		} {
			if _, err := pool.Exec(ctx, q); err != nil {
				return nil, nil, fmt.Errorf("copy the ledger for the raw settlement: %w", err)
			}
		}
	}
	return &store{Backend: st, db: stdlib.OpenDBFromPool(st.Pool()), read: st.ReadDB()},
		&pgSettler{pool: pool, runID: jobs.RunID(settlement.Job.Name(), benchDate), bal: map[string]*pgAccount{}}, nil
}

// pgSettler is the hand-written set-based settlement.
type pgSettler struct {
	pool  *pgxpool.Pool
	runID string
	rawPage
	bal map[string]*pgAccount
	// The chunk's arrays, reused.
	ids, keys, statuses, errs []string
	outputs                   [][]byte
	newBal, oldVer            []int64
}

type pgAccount struct {
	balance, version int64
	touched          bool
}

// chunk settles the next Chunk transfers in one transaction: BEGIN and
// the page of transfers in one round trip, one read of every account the
// page touches, then (in Go, in transfer order) each overdraft rejected
// and the balances folded; one version-CAS UPDATE of the touched accounts
// (every one must match) and one INSERT of the chunk's items, pipelined;
// COMMIT.
func (rs *pgSettler) chunk(ctx context.Context) (bool, error) {
	// Over 80 lines: the raw baseline of one chunk is one round trip written out, as a hand-written settlement would be.
	first := func(b *pgx.Batch) { b.Queue(sqlPGRawTransfers, benchDate, rs.after, Chunk) }
	err := pgTx(ctx, rs.pool, first, func(br pgx.BatchResults) error {
		rows, err := br.Query()
		if err != nil {
			return err
		}
		err = rs.fill(rows)
		rows.Close()
		return err
	}, func(conn *pgx.Conn) error {
		if len(rs.xs) == 0 {
			return nil
		}
		clear(rs.bal)
		rs.ids = rs.ids[:0]
		for _, x := range rs.xs {
			for _, a := range [2]string{x.from, x.to} {
				if rs.bal[a] == nil {
					rs.bal[a] = &pgAccount{}
					rs.ids = append(rs.ids, a)
				}
			}
		}
		rows, err := conn.Query(ctx, sqlPGRawAccounts, rs.ids)
		if err != nil {
			return err
		}
		found := 0
		for rows.Next() {
			var id string
			var a pgAccount
			if err := rows.Scan(&id, &a.balance, &a.version); err != nil {
				rows.Close()
				return err
			}
			*rs.bal[id] = a
			found++
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		if found != len(rs.ids) {
			return fmt.Errorf("raw: %d of %d accounts found", found, len(rs.ids))
		}
		rs.keys, rs.statuses, rs.errs, rs.outputs = rs.keys[:0], rs.statuses[:0], rs.errs[:0], rs.outputs[:0]
		for _, x := range rs.xs {
			from, to := rs.bal[x.from], rs.bal[x.to]
			status, reason := checkpoint.StepCompleted, ""
			if from.balance-x.amount < 0 {
				status, reason = checkpoint.StepRejected, "overdraft"
			} else {
				from.balance -= x.amount
				to.balance += x.amount
				from.touched, to.touched = true, true
			}
			rs.keys, rs.statuses, rs.errs = append(rs.keys, x.id), append(rs.statuses, status), append(rs.errs, reason)
			rs.outputs = append(rs.outputs, strconv.AppendInt(nil, x.amount, 10))
		}
		touched := rs.ids[:0:0]
		rs.newBal, rs.oldVer = rs.newBal[:0], rs.oldVer[:0]
		for _, id := range rs.ids {
			if a := rs.bal[id]; a.touched {
				touched = append(touched, id)
				rs.newBal, rs.oldVer = append(rs.newBal, a.balance), append(rs.oldVer, a.version)
			}
		}
		b := &pgx.Batch{}
		b.Queue(sqlPGRawAccCAS, touched, rs.newBal, rs.oldVer)
		b.Queue(sqlPGRawItems, rs.runID, rs.keys, rs.statuses, rs.outputs, rs.errs)
		br := conn.SendBatch(ctx, b)
		tag, err := br.Exec()
		if err == nil && tag.RowsAffected() != int64(len(touched)) {
			err = fmt.Errorf("raw: %d of %d account versions moved", int64(len(touched))-tag.RowsAffected(), len(touched))
		}
		if err == nil {
			_, err = br.Exec()
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		return err
	})
	if err != nil {
		return false, err
	}
	return rs.advance(), nil
}

func (rs *pgSettler) loadKeys(ctx context.Context, runID string, n int) (int, error) {
	rows, err := rs.pool.Query(ctx, sqlPGRawItemKeys, runID)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	return keyStatuses(rows, n)
}

func (rs *pgSettler) rejected(ctx context.Context) (int, error) {
	var n int
	err := rs.pool.QueryRow(ctx, sqlPGRawRejected).Scan(&n)
	return n, err
}

func (rs *pgSettler) balances(ctx context.Context) (string, error) {
	db := stdlib.OpenDBFromPool(rs.pool) // closing it leaves the pool open
	defer db.Close()
	return balances(ctx, db)
}

// pgClaims is the queue-claim baseline: one autocommit UPDATE claims
// with FOR UPDATE SKIP LOCKED, one marks the job done.
type pgClaims struct{ pool *pgxpool.Pool }

func (p *postgresBackend) claimSides(ctx context.Context, name string, conns, n int, analyze bool) (*store, rawClaims, error) {
	st, _, err := p.openConns(ctx, name, int32(conns))
	if err != nil {
		return nil, nil, err
	}
	ours := &store{Backend: st, db: stdlib.OpenDBFromPool(st.Pool()), read: st.ReadDB()}
	raw, _, err := p.openConns(ctx, name+"_raw", int32(conns))
	if err != nil {
		return nil, nil, err
	}
	if _, err := raw.Pool().Exec(ctx, sqlPGRawQueueTable); err != nil {
		return nil, nil, err
	}
	if _, err := raw.Pool().Exec(ctx, sqlPGRawQueueSeed, n); err != nil {
		return nil, nil, err
	}
	if analyze {
		if _, err := raw.Pool().Exec(ctx, "ANALYZE raw_queue"); err != nil {
			return nil, nil, err
		}
	}
	return ours, &pgClaims{pool: raw.Pool()}, nil
}

func (p *postgresBackend) release(ours *store, raw rawClaims) {
	if ours == nil {
	} else if st, ok := ours.Backend.(*postgres.Store); ok {
		st.Pool().Reset()
	}
	if rc, ok := raw.(*pgClaims); ok {
		rc.pool.Reset()
	}
}

func (r *pgClaims) claim(ctx context.Context, owner string) (string, bool, error) {
	var id string
	err := r.pool.QueryRow(ctx, sqlPGRawClaim, owner).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false, nil
	}
	return id, err == nil, err
}

func (r *pgClaims) finish(ctx context.Context, id string) error {
	tag, err := r.pool.Exec(ctx, sqlPGRawFinish, id)
	if err == nil && tag.RowsAffected() != 1 {
		err = fmt.Errorf("raw: job %s was not running", id)
	}
	return err
}

func (r *pgClaims) done(ctx context.Context) (int, error) {
	var n int
	err := r.pool.QueryRow(ctx, sqlPGRawDone).Scan(&n)
	return n, err
}

package sqlite_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/sqlite"
)

// A same-store view writes the rows it read by rowid where the table has
// rowids; every shape of table reads, writes and refuses a stale version
// alike.
func TestSameStoreWritesEveryTableShape(t *testing.T) {
	for name, ddl := range map[string]string{
		"rowid":         `CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL, version INTEGER NOT NULL)`,
		"without rowid": `CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL, version INTEGER NOT NULL) WITHOUT ROWID`,
		// rowid then names this column, not the row: not used to write.
		"a column named rowid": `CREATE TABLE accounts (id TEXT PRIMARY KEY, rowid INTEGER, balance INTEGER NOT NULL, version INTEGER NOT NULL)`,
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			path := filepath.Join(t.TempDir(), "ck.db")
			w, err := sqlite.OpenTarget(ctx, sqlite.Config{Path: path})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := w.Exec(ddl + `; INSERT INTO accounts (id, balance, version) VALUES ('a', 100, 3), ('b', 0, 1), ('c', 7, 1)`); err != nil {
				t.Fatal(err)
			}
			w.Close()
			st, err := sqlite.Open(ctx, sqlite.Config{Path: path})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			now := time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC)
			c, err := st.Claim(ctx, checkpoint.ClaimRequest{RunID: "job/k", Job: "job", RunKey: "k", Params: []byte(`{}`), ParamsHash: "h",
				Owner: "a:1", Now: now, LeaseFor: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			write := func(ws ...checkpoint.Write) error {
				return st.InTx(ctx, c.Lease, func(tx checkpoint.Tx) error {
					v, err := tx.Target(accounts)
					if err != nil {
						return err
					}
					cur, err := v.Read(ctx, []string{"a", "b"})
					if err != nil {
						return err
					}
					if !cur["a"].Exists || !cur["b"].Exists {
						t.Errorf("read a and b = %+v", cur)
					}
					return v.Write(ctx, ws)
				})
			}
			// A key not read in the transaction is written by key.
			if err := write(checkpoint.Write{Key: "a", OldVersion: 3, NewValue: 60}, checkpoint.Write{Key: "b", OldVersion: 1, NewValue: 40},
				checkpoint.Write{Key: "c", OldVersion: 1, NewValue: 8}); err != nil {
				t.Fatal(err)
			}
			var conflict *checkpoint.VersionConflictError
			err = write(checkpoint.Write{Key: "a", OldVersion: 4, NewValue: 1}, checkpoint.Write{Key: "b", OldVersion: 1, NewValue: 99})
			if !errors.As(err, &conflict) || conflict.Key != "b" || conflict.Found != 2 {
				t.Fatalf("a write of b at its old version 1: %v; want a version conflict on b, found 2", err)
			}
			got := map[string][2]int64{}
			rows, err := st.ReadDB().Query(`SELECT id, balance, version FROM accounts`)
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			for rows.Next() {
				var k string
				var b, v int64
				if err := rows.Scan(&k, &b, &v); err != nil {
					t.Fatal(err)
				}
				got[k] = [2]int64{b, v}
			}
			want := map[string][2]int64{"a": {60, 4}, "b": {40, 2}, "c": {8, 2}}
			for k, w := range want {
				if got[k] != w {
					t.Errorf("account %s = %v (balance, version); want %v (the refused write rolled back whole)", k, got[k], w)
				}
			}
		})
	}
}

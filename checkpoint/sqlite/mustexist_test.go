package sqlite_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/checkpoint/sqlite"
)

// TestMustExistCreatesNothing: with Config.MustExist a missing database is
// an ErrNoDatabase naming its absolute path (the path given is relative
// here, so t.Chdir: not in parallel), for the store, an effect target and
// a target reader (which never creates), and no file appears; an existing
// file opens as usual.
func TestMustExistCreatesNothing(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	t.Chdir(dir)
	abs := filepath.Join(dir, "missing.db")
	for name, open := range map[string]func() error{
		"Open": func() error {
			st, err := sqlite.Open(ctx, sqlite.Config{Path: "missing.db", MustExist: true})
			if err == nil {
				st.Close()
			}
			return err
		},
		"OpenTarget": func() error {
			db, err := sqlite.OpenTarget(ctx, sqlite.Config{Path: "missing.db", MustExist: true})
			if err == nil {
				db.Close()
			}
			return err
		},
		"OpenTargetReader": func() error {
			db, err := sqlite.OpenTargetReader(ctx, sqlite.Config{Path: "missing.db"})
			if err == nil {
				db.Close()
			}
			return err
		},
	} {
		err := open()
		if !errors.Is(err, checkpoint.ErrNoDatabase) || !strings.Contains(err.Error(), abs) {
			t.Errorf("%s: err = %v; want ErrNoDatabase naming %s", name, err, abs)
		}
		entries, _ := os.ReadDir(dir)
		if len(entries) != 0 {
			t.Fatalf("%s of a missing file created %v", name, entries)
		}
	}
	if _, err := os.Stat(abs); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("stat: %v", err)
	}

	// Existing files open; without MustExist a target is created (seeding
	// a new ledger).
	st, err := sqlite.Open(ctx, sqlite.Config{Path: "made.db"})
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	st, err = sqlite.Open(ctx, sqlite.Config{Path: "made.db", MustExist: true})
	if err != nil {
		t.Fatalf("MustExist on an existing store: %v", err)
	}
	st.Close()
	db, err := sqlite.OpenTarget(ctx, sqlite.Config{Path: "new-ledger.db"})
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	if _, err := os.Stat(filepath.Join(dir, "new-ledger.db")); err != nil {
		t.Errorf("OpenTarget without MustExist did not create the file: %v", err)
	}
}

package checkpoint_test

import (
	"strings"
	"testing"
	"testing/fstest"

	"github.com/stepwise-run/stepwise/checkpoint"
)

func TestReadMigrations(t *testing.T) {
	ms, err := checkpoint.ReadMigrations(fstest.MapFS{
		"m/0010_ten.sql": {Data: []byte("ten")},
		"m/0002_two.sql": {Data: []byte("two")},
	}, "m")
	if err != nil || len(ms) != 2 || ms[0].Version != 2 || ms[1].Version != 10 || ms[1].SQL != "ten" || ms[0].Name != "0002_two.sql" {
		t.Fatalf("ReadMigrations = %+v, %v; want 2 then 10, in version (not name) order", ms, err)
	}
	for _, bad := range []fstest.MapFS{
		{"m/two.sql": {}},
		{"m/0002_a.sql": {}, "m/2_b.sql": {}},
		{"m/0003_c.txt": {}},
	} {
		if _, err := checkpoint.ReadMigrations(bad, "m"); err == nil || !strings.Contains(err.Error(), "migration file") {
			t.Errorf("ReadMigrations(%v): %v; want an error naming the file", bad, err)
		}
	}
}

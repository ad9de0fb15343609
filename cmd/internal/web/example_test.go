package web_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	"github.com/stepwise-run/stepwise/checkpoint/stores"
	"github.com/stepwise-run/stepwise/cmd/internal/web"
)

// The dashboard over a fresh store, without authentication (as the API
// of a server without tokens): the runs list has none yet.
func Example() {
	dir, err := os.MkdirTemp("", "stepwise-web")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	st, err := stores.Open(context.Background(), filepath.Join(dir, "stepwise.db"), stores.Settings{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer st.Close()

	dash, err := web.New(web.Config{Store: st})
	if err != nil {
		fmt.Println(err)
		return
	}
	rec := httptest.NewRecorder()
	dash.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	fmt.Println(rec.Code, rec.Header().Get("Content-Type"))
	fmt.Println(strings.Contains(rec.Body.String(), "No runs."))
	// Output:
	// 200 text/html; charset=utf-8
	// true
}

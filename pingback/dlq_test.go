package pingback

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// With no solveonce running, the Manager works on the file itself: list,
// replay (once per entry; failures stay), drop.
func TestManagerOffline(t *testing.T) {
	var calls atomic.Int64
	var up atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if !up.Load() || r.URL.Query().Get("code") != "ANS" {
			w.WriteHeader(http.StatusBadGateway)
		}
	}))
	defer srv.Close()
	dir := t.TempDir()
	cfg := DefaultConfig()
	ctx := context.Background()

	m, err := Manage(cfg, dir)
	require.NoError(t, err)
	entries, err := m.List(ctx)
	require.NoError(t, err)
	require.Empty(t, entries, "no file yet: nothing to list, nothing created")
	require.NoError(t, m.Close())

	path, _ := cfg.Path(dir)
	st, err := OpenStore(path, time.Second)
	require.NoError(t, err)
	now := time.Now()
	require.NoError(t, st.Bury(
		Entry{Account: "acct", Task: "1", URL: srv.URL + "/a", Code: "ANS", Attempts: 3, Failed: now},
		Entry{Account: "acct", Task: "2", URL: srv.URL + "/b", Failed: now.Add(time.Second)},
		Entry{Account: "acct", Task: "3", URL: srv.URL + "/c", Code: "ANS", Failed: now.Add(2 * time.Second)},
	))
	require.EqualValues(t, 3, st.Len())
	require.NoError(t, st.Close())

	m, err = Manage(cfg, dir)
	require.NoError(t, err)
	defer m.Close()
	require.False(t, m.Remote())
	entries, err = m.List(ctx)
	require.NoError(t, err)
	require.Len(t, entries, 3)
	require.Equal(t, "1", entries[0].Task, "oldest first")

	res, err := m.Replay(ctx, []string{entries[0].ID[:6]})
	require.NoError(t, err)
	require.Len(t, res, 1)
	require.Equal(t, StatusFailed, res[0].Status)
	entries, _ = m.List(ctx)
	require.Equal(t, 4, entries[0].Attempts)

	up.Store(true)
	res, err = m.Replay(ctx, nil)
	require.NoError(t, err)
	status := map[string]string{}
	for _, r := range res {
		status[r.Task] = r.Status
	}
	require.Equal(t, map[string]string{"1": StatusDelivered, "2": StatusSkipped, "3": StatusDelivered}, status)
	entries, _ = m.List(ctx)
	require.Len(t, entries, 1)

	_, err = m.Replay(ctx, []string{"zzzz"})
	require.Error(t, err)
	n, err := m.Drop(ctx, nil, true)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.EqualValues(t, 3, calls.Load())
}

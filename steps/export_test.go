package steps

import "time"

// SetPartitionReplanTime shortens PartitionReplanTime for a test, until
// the returned restore is called.
func SetPartitionReplanTime(d time.Duration) (restore func()) {
	old := replanTime.Swap(int64(d))
	return func() { replanTime.Store(old) }
}

// Package checkpoint is the durable record of Stepwise: runs, attempts,
// leases, fence numbers and step checkpoints, kept in an embedded SQLite
// database.
//
// Import rule: checkpoint imports no other Stepwise package and never reads
// the clock; every time it stores is passed in by the caller.
//
// The common case is to open a store and hand it to a runner:
//
//	st, err := checkpoint.Open(ctx, checkpoint.Config{Path: "stepwise.db"})
//	if err != nil {
//		return err // names the file and what is wrong with it
//	}
//	defer st.Close()
//
// A run is claimed with [Store.Claim], which increments the run's fence
// number. Every later write carries that fence ([Lease]) and is refused with
// [ErrFenced] once another runner has claimed the run, so a runner that lost
// its lease writes nothing.
package checkpoint

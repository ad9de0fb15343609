package postgres

import (
	"errors"

	"github.com/stepwise-run/stepwise/checkpoint"
)

// ClassifyError is for a job's own queries of a PostgreSQL database (the
// *sql.DB of a target, steps.Run.TargetDB): it returns err wrapped so that
// errors.Is(err, checkpoint.ErrTransient) holds when trying again may cure
// it (the connection lost or closed by the server, the server starting up
// or shutting down, a serialization failure, a deadlock), and err
// unchanged otherwise. A partitioned step then hands its partition back
// and a pooled run is tried again, as after the store's own faults,
// instead of failing for an operator.
func ClassifyError(err error) error {
	if w := wrapError("the job's database", "a job's query", err); errors.Is(w, checkpoint.ErrTransient) {
		return w
	}
	return err
}

// ClassifyError implements steps' classification of a job's own queries
// on this target's ReadDB (steps.Run.TargetError): ClassifyError.
func (e *effectTarget) ClassifyError(err error) error { return ClassifyError(err) }

// ClassifyError implements steps' classification of a job's own queries
// on this target's ReadDB (steps.Run.TargetError): ClassifyError.
func (d *dbTarget) ClassifyError(err error) error { return ClassifyError(err) }

package cmd

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/stepwise-run/stepwise/checkpoint"
	"github.com/stepwise-run/stepwise/runner/ops"
)

// registerStoreMetrics registers with reg the gauges read from the store
// at scrape time (each job's last success, the runs by status): what the
// whole deployment recorded, whichever process ran it. Only serve serves
// them; a worker's /metrics has its own counters only, so a sum over
// every scraped process counts each run once.
func registerStoreMetrics(env *Env, reg prometheus.Registerer, st checkpoint.Backend) error {
	var jobs []string
	for _, j := range env.Registry.Jobs() {
		jobs = append(jobs, j.Name())
	}
	c, err := ops.NewStoreCollector(ops.StoreCollectorConfig{Store: st, Jobs: jobs, Now: env.now})
	if err != nil {
		return err
	}
	return reg.Register(c)
}

package observe

import (
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// RegisterRuntime registers the Go runtime collector (go_goroutines,
// go_memstats_…), the process collector (process_resident_memory_bytes,
// process_open_fds, …) and shardmq_build_info on reg.
func RegisterRuntime(reg prometheus.Registerer) {
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	version, revision, goVersion := BuildInfo()
	info := prometheus.NewGauge(prometheus.GaugeOpts{Name: "shardmq_build_info",
		Help:        "Always 1; the labels say which build runs: module version, VCS revision (with -dirty for uncommitted changes) and Go version.",
		ConstLabels: prometheus.Labels{"version": version, "revision": revision, "goversion": goVersion}})
	info.Set(1)
	reg.MustRegister(info)
}

// BuildInfo returns the main module's version, the VCS revision it was
// built from and the Go version, "unknown" where the binary does not say.
func BuildInfo() (version, revision, goVersion string) {
	version, revision, goVersion = "unknown", "unknown", "unknown"
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return
	}
	goVersion = bi.GoVersion
	if bi.Main.Version != "" {
		version = bi.Main.Version
	}
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			revision = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if dirty && revision != "unknown" {
		revision += "-dirty"
	}
	return
}

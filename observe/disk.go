package observe

import (
	"github.com/prometheus/client_golang/prometheus"
)

var (
	descDiskFree = prometheus.NewDesc("shardmq_disk_free_bytes",
		"Bytes available to unprivileged users on the file system holding path.", []string{"path"}, nil)
	descDiskSize = prometheus.NewDesc("shardmq_disk_size_bytes",
		"Size of the file system holding path.", []string{"path"}, nil)
)

// DiskCollector exports the free and total bytes of the file systems
// holding some directories (the sandbox's, a MySQL data directory on the
// router's machine), read at scrape time. A path that cannot be read is
// left out.
type DiskCollector struct{ paths []string }

// NewDiskCollector watches paths.
func NewDiskCollector(paths []string) DiskCollector {
	return DiskCollector{append([]string(nil), paths...)}
}

// Describe implements prometheus.Collector.
func (c DiskCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descDiskFree
	ch <- descDiskSize
}

// Collect implements prometheus.Collector.
func (c DiskCollector) Collect(ch chan<- prometheus.Metric) {
	for _, p := range c.paths {
		free, size, err := diskSpace(p)
		if err != nil {
			continue
		}
		ch <- prometheus.MustNewConstMetric(descDiskFree, prometheus.GaugeValue, float64(free), p)
		ch <- prometheus.MustNewConstMetric(descDiskSize, prometheus.GaugeValue, float64(size), p)
	}
}

package loadtest

import (
	"fmt"
	"math"
	"strings"
)

// CapacityTarget is the load a fleet must carry, and the hosts it is
// built of; the capacity model sizes it from the CPU per message a run
// measured (docs/capacity.md).
type CapacityTarget struct {
	// Produce and Consume in messages/s. Default 100,000 and 50,000 (the
	// quarterly target).
	Produce, Consume float64
	// Utilization is the share of each host's cores the fleet may use at
	// the target, leaving the rest as headroom. Default 0.7.
	Utilization float64
	// Cores of a database host (primary or replica), a router host and a
	// load-generator host. Defaults 16, 8 and 8.
	DBCores, RouterCores, GeneratorCores int
	// ClusterRate, when set, is the most messages moved per second one
	// cluster carries whatever its cores (its commit rate: fsyncs,
	// replication), measured on the production hardware; the clusters
	// are then at least the target over it. 0: CPU only.
	ClusterRate float64
}

func (c CapacityTarget) withDefaults() CapacityTarget {
	if c.Produce <= 0 && c.Consume <= 0 {
		c.Produce, c.Consume = 100000, 50000
	}
	if c.Utilization <= 0 || c.Utilization > 1 {
		c.Utilization = 0.7
	}
	if c.DBCores <= 0 {
		c.DBCores = 16
	}
	if c.RouterCores <= 0 {
		c.RouterCores = 8
	}
	if c.GeneratorCores <= 0 {
		c.GeneratorCores = 8
	}
	return c
}

// Capacity is the model's answer for one run.
type Capacity struct {
	Target CapacityTarget `json:"target"`
	// Phase the inputs come from, and its mix: messages produced and
	// consumed (the model charges each the same CPU, so the mix of the
	// run should be near the target's).
	Phase    string `json:"phase"`
	Produced int64  `json:"produced"`
	Consumed int64  `json:"consumed"`
	// Split: the drain consumed enough (a tenth of the messages, 1,000
	// at least) to tell a produced message's cost from a consumed one's;
	// then the cores are the target's mix of the two. The counts: up to
	// the end of the duration, and consumed in the drain.
	Split         bool  `json:"split"`
	MixProduced   int64 `json:"mix_produced,omitempty"`
	MixConsumed   int64 `json:"mix_consumed,omitempty"`
	DrainConsumed int64 `json:"drain_consumed,omitempty"`
	// Measured CPU per message moved, µs, and the throughput per
	// CPU-second of each part (messages moved per second of its CPU).
	Inputs []CapacityPart `json:"inputs"`
	// Clusters, routers and generator hosts needed; ReplicasPerCluster as
	// in the run.
	Clusters int `json:"clusters"`
	// ByCommitRate is the clusters Target.ClusterRate asks for (0 when
	// not given).
	ByCommitRate       int `json:"clusters_by_commit_rate,omitempty"`
	ReplicasPerCluster int `json:"replicas_per_cluster"`
	Routers            int `json:"routers"`
	Generators         int `json:"generators"`
	// Limit says what held the run below its target: "none" (reached),
	// "generator", "machine" (every core busy, mostly the system under
	// test), "shared" (every core busy, a quarter or more by processes
	// that are neither: a shared machine) or "system" (the system under
	// test, with cores idle: bound by latency — commits, fsyncs, locks —
	// not by CPU). LimitText says
	// it in a sentence.
	Limit     string `json:"limit"`
	LimitText string `json:"limit_text"`
}

// CapacityPart is one part of the system in the model.
type CapacityPart struct {
	Name         string  `json:"name"` // router, primary, replica, generator
	PerMessageUS float64 `json:"us_per_message"`
	PerCPUSecond float64 `json:"messages_per_cpu_s"`
	// ProduceUS and ConsumeUS split PerMessageUS (when Capacity.Split).
	ProduceUS float64 `json:"us_per_produced,omitempty"`
	ConsumeUS float64 `json:"us_per_consumed,omitempty"`
	// Cores needed at the target at the measured efficiency, with the
	// headroom (divided by Utilization).
	Cores float64 `json:"cores_needed"`
	Hosts int     `json:"hosts"`
}

// capacity applies the model to the first router phase that produced and
// consumed with its CPU measured; nil when there is none.
func capacity(rep *Report, target CapacityTarget, replicasPerCluster int) *Capacity {
	t := target.withDefaults()
	var p *PhaseReport
	for i := range rep.Phases {
		ph := &rep.Phases[i]
		if ph.Target == "router" && !ph.Preload && ph.Kind == "mixed" && len(ph.CPU) > 0 {
			p = ph
			break
		}
	}
	if p == nil {
		return nil
	}
	by := map[string]CPUUse{}
	for _, u := range p.CPU {
		by[u.Name] = u
	}
	c := &Capacity{Target: t, Phase: p.Name, ReplicasPerCluster: replicasPerCluster}
	for _, pt := range p.Timeline {
		c.Produced += pt.Produced
		c.Consumed += pt.Consumed
	}
	moved := float64(c.Produced + c.Consumed)
	if moved == 0 {
		return nil
	}
	// The split: up to the end of the duration producers and consumers
	// ran together; after it, in the drain, only consumers. The drain's
	// CPU over its consumed messages is a consumed message's cost; the
	// mix's CPU less its consumed messages at that cost, over its
	// produced messages, a produced message's.
	var mixP, mixC int64
	for _, pt := range p.Timeline {
		if float64(pt.Second) < rep.Settings.DurationS {
			mixP += pt.Produced
			mixC += pt.Consumed
		}
	}
	drainC := c.Consumed - mixC
	c.Split = mixP > 0 && drainC >= 1000 && float64(drainC) >= 0.1*float64(c.Consumed)
	if c.Split {
		c.MixProduced, c.MixConsumed, c.DrainConsumed = mixP, mixC, drainC
	}
	rate := t.Produce + t.Consume
	part := func(name string, u CPUUse, hostCores int) CapacityPart {
		secs := u.Seconds
		cp := CapacityPart{Name: name, PerMessageUS: secs * 1e6 / moved}
		if secs > 0 {
			cp.PerCPUSecond = moved / secs
		}
		perS := rate * secs / moved
		if c.Split && u.MixSeconds > 0 {
			cons := (secs - u.MixSeconds) / float64(drainC)
			prod := (u.MixSeconds - cons*float64(mixC)) / float64(mixP)
			if prod > 0 && cons > 0 {
				cp.ProduceUS, cp.ConsumeUS = prod*1e6, cons*1e6
				perS = t.Produce*prod + t.Consume*cons
			}
		}
		cp.Cores = perS / t.Utilization
		cp.Hosts = int(math.Ceil(cp.Cores / float64(hostCores)))
		return cp
	}
	gen := CPUUse{Seconds: by["loadtest"].Seconds + by["coordinator"].Seconds, MixSeconds: by["loadtest"].MixSeconds + by["coordinator"].MixSeconds}
	router := part("router", by["router"], t.RouterCores)
	primary := part("primary", by["primary"], t.DBCores)
	replica := part("replica", by["replica"], t.DBCores)
	generator := part("generator", gen, t.GeneratorCores)
	c.Clusters = max(primary.Hosts, 1)
	if t.ClusterRate > 0 {
		c.ByCommitRate = int(math.Ceil(rate / t.ClusterRate))
		c.Clusters = max(c.Clusters, c.ByCommitRate)
	}
	if replicasPerCluster > 0 {
		// Each cluster's replicas apply that cluster's writes: as many
		// replica hosts per cluster as in the run, each with its share.
		replica.Hosts = c.Clusters * replicasPerCluster
	}
	c.Routers = max(router.Hosts, 1)
	c.Generators = max(generator.Hosts, 1)
	c.Inputs = []CapacityPart{router, primary}
	if _, ok := by["replica"]; ok {
		c.Inputs = append(c.Inputs, replica)
	}
	c.Inputs = append(c.Inputs, generator)
	c.Limit, c.LimitText = limitOf(p, by, gen.Seconds, rep.Host.CPUs)
	return c
}

// limitOf says what held a phase below its targets.
func limitOf(p *PhaseReport, by map[string]CPUUse, genSecs float64, cpus int) (string, string) {
	reached := func(f *Flow) bool { return f == nil || f.Target <= 0 || f.PerSecond >= 0.95*f.Target }
	if reached(p.Produce) && reached(p.Consume) {
		return "none", "The targets were reached: neither the generator nor the system under test was the limit."
	}
	m := by["machine"]
	wall := p.ElapsedS
	genCores := 0.0
	if wall > 0 {
		genCores = genSecs / wall
	}
	share := 0.0
	if m.Seconds > 0 {
		share = genSecs / m.Seconds
	}
	busy := float64(cpus) > 0 && m.Cores >= 0.9*float64(cpus)
	// What neither the generator nor the system under test (the routers
	// and servers this run watched) used: other processes on the machine.
	sut := by["router"].Seconds + by["mariadbd"].Seconds
	if _, ok := by["mariadbd"]; !ok {
		sut += by["primary"].Seconds + by["replica"].Seconds
	}
	others := 0.0
	if m.Seconds > 0 && sut > 0 {
		others = max(0, m.Seconds-sut-genSecs) / m.Seconds
	}
	for _, g := range p.Generators {
		// A worker on a machine of its own: its process, or its machine
		// with the process taking a quarter of it.
		if c := float64(g.CPUs); c > 0 && (g.Cores >= 0.9*c || (g.MachineCores >= 0.9*c && g.Cores >= 0.25*g.MachineCores)) {
			return "generator", fmt.Sprintf("The generator was the limit, not the system under test: worker %d kept %.2f of its machine's %d cores busy by itself (%.2f busy in all).", g.Worker, g.Cores, g.CPUs, g.MachineCores)
		}
	}
	switch {
	case float64(cpus) > 0 && genCores >= 0.9*float64(cpus):
		return "generator", fmt.Sprintf("The generator was the limit, not the system under test: it kept %.2f of %d cores busy by itself.", genCores, cpus)
	case busy && share >= 0.25:
		return "generator", fmt.Sprintf("The generator was the limit, not the system under test: every core was busy (%.2f of %d) and the generator took %.0f %% of them; run it on other machines (-workers).", m.Cores, cpus, 100*share)
	case busy && others >= 0.25:
		return "shared", fmt.Sprintf("The machine was the limit, and not this run's alone: every core was busy (%.2f of %d), the generator took %.0f %% of them and other processes %.0f %%; the system under test got the rest.", m.Cores, cpus, 100*share, 100*others)
	case busy:
		return "machine", fmt.Sprintf("The system under test was the limit: every core of this machine was busy (%.2f of %d), and the generator took only %.0f %% of them.", m.Cores, cpus, 100*share)
	}
	return "system", fmt.Sprintf("The system under test was the limit without using every core (%.2f of %d busy; the generator %.0f %%): bound by latency (commits, fsyncs, locks), not CPU.", m.Cores, cpus, 100*share)
}

// writeCapacity renders the model.
func (r *Report) writeCapacity(w func(string, ...any)) {
	c := r.Capacity
	if c == nil {
		return
	}
	t := c.Target
	w("\n## Capacity\n\n")
	w("%s\n\n", c.LimitText)
	w("Measured in %q: %d produced and %d consumed (a message moved is one of either). ", c.Phase, c.Produced, c.Consumed)
	if c.Split {
		w("The drain consumed %d of them with the producers stopped: its CPU gives a consumed message's cost, the rest a produced one's, and the cores are the target's mix of both. ", c.DrainConsumed)
	} else {
		w("The drain was too short to tell producing from consuming: the cores assume both cost the average. ")
	}
	w("For %s produced/s + %s consumed/s at %.0f %% of each host's cores (the model, its checks and its limits: docs/capacity.md):\n\n",
		human(t.Produce), human(t.Consume), 100*t.Utilization)
	capacityTable(c).markdown(w)
	var parts []string
	for _, p := range c.Inputs {
		if p.Name != "generator" {
			parts = append(parts, fmt.Sprintf("%.1f %s", p.Cores, p.Name))
		}
	}
	limit := "CPU only: a cluster's commit rate (fsyncs, replication) is not in these figures unless -capacity-cluster-rate gives it"
	if c.ByCommitRate > 0 {
		limit = fmt.Sprintf("%s by the commit rate of %s messages/s per cluster (-capacity-cluster-rate)", plural(c.ByCommitRate, "cluster"), human(t.ClusterRate))
	}
	w("\nFleet: **%s, %s** (%s cores), plus %s to drive it. %s; the headroom for failover is not either, and the figures hold only as long as the cost per message stays flat as the fleet grows (docs/capacity.md). On a machine shared with other work the CPU per message is inflated by contention.\n",
		plural(c.Clusters, "cluster"), plural(c.Routers, "router"), strings.Join(parts, " + "), plural(c.Generators, "generator machine"), limit)
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

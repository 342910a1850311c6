package testbed

import (
	"slices"
	"testing"
)

// The sandbox runs with the deployment's sizing, test beds with the small
// one, and an explicit buffer pool still overrides; the flags carry them.
func TestServerSettingsPerKindOfBed(t *testing.T) {
	tests := []struct {
		name string
		spec Spec
		want ServerSettings
	}{
		{"test bed", Spec{}, TestSettings()},
		{"sandbox", sandboxSized(Spec{}), DeploymentSettings()},
		{"sandbox, own settings", sandboxSized(Spec{Server: ServerSettings{BufferPool: "1G", RedoLog: "256M", MaxConnections: 50}}),
			ServerSettings{BufferPool: "1G", RedoLog: "256M", MaxConnections: 50}},
		{"buffer pool override", Spec{BufferPoolSize: "256M"}, ServerSettings{BufferPool: "256M", RedoLog: TestSettings().RedoLog,
			MaxConnections: TestSettings().MaxConnections, BinlogRowImage: TestSettings().BinlogRowImage,
			BinlogAnnotateRowEvents: TestSettings().BinlogAnnotateRowEvents}},
	}
	for _, tc := range tests {
		got, err := tc.spec.withDefaults()
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got.Server != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got.Server, tc.want)
		}
		b := &Bed{spec: got}
		args := b.serverArgs(&Instance{})
		for _, a := range tc.want.args() {
			if !slices.Contains(args, a) {
				t.Errorf("%s: server flags %v lack %s", tc.name, args, a)
			}
		}
	}
}

package cmd

import (
	"fmt"
	"runtime/debug"
	"strings"
)

// modulePath is Stepwise's module, named in --version when the program is
// another module that uses it.
const modulePath = "github.com/stepwise-run/stepwise"

// readBuildInfo is the running binary's build information, nil if it has
// none.
func readBuildInfo() *debug.BuildInfo {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return nil
	}
	return bi
}

// versionText is what --version prints for the program name and its build
// information (nil: none): the main module's version, its path, Stepwise's
// version when the program is another module, the VCS revision and commit
// time, and the Go version. A binary built without VCS information (go
// test, -buildvcs=false, a build outside the repository) says so.
func versionText(name string, bi *debug.BuildInfo) string {
	if bi == nil {
		return name + " (version unknown: the binary carries no build information)"
	}
	var b strings.Builder
	version := bi.Main.Version
	if version == "" {
		version = "(devel)"
	}
	fmt.Fprintf(&b, "%s %s\n", name, version)
	if bi.Main.Path != "" {
		fmt.Fprintf(&b, "  module    %s\n", bi.Main.Path)
	}
	if bi.Main.Path != modulePath {
		for _, d := range bi.Deps {
			if d.Path != modulePath {
				continue
			}
			v := d.Version
			if r := d.Replace; r != nil {
				v += " => " + strings.TrimSpace(r.Path+" "+r.Version)
			}
			fmt.Fprintf(&b, "  stepwise  %s\n", v)
		}
	}
	var rev, at, vcs string
	modified := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs":
			vcs = s.Value
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if rev == "" {
		b.WriteString("  revision  unknown (built without VCS information: by go test, with -buildvcs=false, or outside a repository)\n")
	} else {
		var notes []string
		if vcs != "" {
			notes = append(notes, vcs)
		}
		if at != "" {
			notes = append(notes, "committed "+at)
		}
		if modified {
			notes = append(notes, "with uncommitted changes")
		}
		fmt.Fprintf(&b, "  revision  %s", rev)
		if len(notes) > 0 {
			fmt.Fprintf(&b, " (%s)", strings.Join(notes, ", "))
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "  go        %s", bi.GoVersion)
	return b.String()
}

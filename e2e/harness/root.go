package harness

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Mount is one volume of a "container": Src on the host appears at Dst inside its root.
type Mount struct {
	Src, Dst string
	RW       bool
}

// Container is a process run the way a pod's container runs it: in a mount namespace of its
// own (unshare --mount), chrooted into a root that holds only its mounts (a tmpfs with the
// image's files and the pod's volumes bound in), as uid/gid 65532 unless Root is set. The
// host's real paths (/plugins, /var/run/credbroker, /etc/kueue/...) are never touched: the
// mounts live and die with the process's namespace.
type Container struct {
	Name  string
	Argv  []string // inside the root
	Env   []string
	Mount []Mount
	Root  bool // run as uid 0 instead of 65532
	Dir   string
	Log   string // host path of the combined stdout/stderr

	proc
}

const launcher = `set -e
R="$1"; M="$2"; U="$3"; shift 3
mount -t tmpfs -o mode=0755 tmpfs "$R"
mkdir -p "$R/proc" "$R/dev" "$R/tmp"
chmod 1777 "$R/tmp"
mount --rbind /proc "$R/proc"
mount --rbind /dev "$R/dev"
while IFS='	' read -r src dst rw; do
  [ -n "$src" ] || continue
  if [ -d "$src" ]; then mkdir -p "$R$dst"; else mkdir -p "$(dirname "$R$dst")"; : > "$R$dst"; fi
  mount --bind "$src" "$R$dst"
  if [ "$rw" = ro ]; then mount -o remount,bind,ro "$R$dst"; fi
done < "$M"
exec chroot --userspec="$U" "$R" "$@"
`

// Start launches the container.
func (c *Container) Start() error {
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return err
	}
	root := filepath.Join(c.Dir, "root")
	if err := os.MkdirAll(root, 0o755); err != nil {
		return err
	}
	var b strings.Builder
	for _, m := range c.Mount {
		if _, err := os.Stat(m.Src); err != nil {
			return fmt.Errorf("%s: volume %s: %w", c.Name, m.Dst, err)
		}
		mode := "ro"
		if m.RW {
			mode = "rw"
		}
		fmt.Fprintf(&b, "%s\t%s\t%s\n", m.Src, m.Dst, mode)
	}
	mounts := filepath.Join(c.Dir, "mounts.tsv")
	if err := os.WriteFile(mounts, []byte(b.String()), 0o644); err != nil {
		return err
	}
	user := "65532:65532"
	if c.Root {
		user = "0:0"
	}
	args := append([]string{"--mount", "--propagation", "private", "--", "/bin/sh", "-c", launcher, "launcher", root, mounts, user}, c.Argv...)
	cmd := exec.Command("unshare", args...)
	// The launcher needs mount and chroot; the program sees the same PATH (its root has its own /bin).
	cmd.Env = append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, c.Env...)
	return c.start(c.Name, cmd, c.Log)
}

// LogText is the container's log so far.
func (c *Container) LogText() string { return logText(c.Log) }

// LogLines returns the lines of the log containing sub.
func (c *Container) LogLines(sub string) []string { return logLines(c.Log, sub) }

func logText(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

func logLines(path, sub string) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		if strings.Contains(sc.Text(), sub) {
			out = append(out, sc.Text())
		}
	}
	return out
}

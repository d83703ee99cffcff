package harness

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
	"time"
)

// proc is one process the suite started and owns: its own process group (so that nothing it
// starts outlives it), killed if the suite dies, its output appended to a log file.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
	mu   sync.Mutex
}

// start runs cmd with its stdout and stderr appended to log.
func (p *proc) start(name string, cmd *exec.Cmd, log string) error {
	logf, err := os.OpenFile(log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	// Linux sends Pdeathsig when the *thread* that forked the child exits, and the Go runtime
	// may retire threads: start and wait from one goroutine locked to its thread, so that
	// thread lives exactly as long as the child.
	started := make(chan error, 1)
	p.done = make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			logf.Close()
			started <- fmt.Errorf("%s: %w", name, err)
			close(p.done)
			return
		}
		started <- nil
		err := cmd.Wait()
		logf.Close()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(p.done)
	}()
	if err := <-started; err != nil {
		return err
	}
	p.cmd = cmd
	return nil
}

// Running reports whether the process has not exited.
func (p *proc) Running() bool {
	if p.done == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Exited is closed when the process exits.
func (p *proc) Exited() <-chan struct{} { return p.done }

// Stop sends SIGTERM, waits up to grace, then kills the whole process group.
func (p *proc) Stop(grace time.Duration) error {
	if p.cmd == nil || !p.Running() {
		return nil
	}
	pgid := p.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-p.done
	}
	// Reap anything left in the group (a shim mid-run).
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	return nil
}

// Pid is the process id (0 before Start).
func (p *proc) Pid() int {
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Daemon is a host process of the suite's own (the node's containerd, kubelet, kube-proxy,
// kube-controller-manager, kube-scheduler): run as root in the suite's network namespace.
type Daemon struct {
	Name string
	Argv []string
	Env  []string // added to the suite's environment
	Log  string
	proc
}

// Start launches the daemon.
func (d *Daemon) Start() error {
	cmd := exec.Command(d.Argv[0], d.Argv[1:]...)
	cmd.Env = append(os.Environ(), d.Env...)
	return d.start(d.Name, cmd, d.Log)
}

// LogText is the daemon's log so far.
func (d *Daemon) LogText() string { return logText(d.Log) }

// Command pause is the pod sandbox ("pause") container's process for the suite's node: the
// kubelet asks containerd for one per pod to hold the pod's namespaces, and it only has to
// stay alive until the runtime stops it. Kubernetes' own pause (build/pause/linux/pause.c)
// also reaps zombies as PID 1 of a shared PID namespace; no pod here shares one, so this one
// only waits.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	// A stop is the expected end: exit 0, as Kubernetes' pause does on SIGTERM and SIGINT.
	os.Exit(0)
}

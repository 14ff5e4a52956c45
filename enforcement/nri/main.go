// Command gpuconf-nri-plugin connects containerd's (or CRI-O's) NRI socket to the gpuconf reference
// node agent: it registers for Synchronize, CreateContainer, PostStartContainer, StopContainer and
// RemoveContainer, forwards each as one JSON request to the agent's hook socket
// (enforcement/hook.py, the NRI forms), and turns the agent's answer into an NRI ContainerAdjustment
// (environment, bind mounts) or a failed CreateContainer carrying the agent's message.
//
// It decides nothing itself, with one exception that cannot wait for the agent: when the agent does
// not answer, a container with placement annotations (nvidia.com/container.<name>.*) is refused
// (fail closed) and any other container is passed untouched.
//
// Every second it reports to the agent whether it is registered with the runtime (the agent's node
// condition is False while it is not); when the agent answers with a new incarnation (it restarted)
// or after requests it could not deliver, it sends the agent a Synchronize with the containers it
// knows to run, so a restarted agent re-adopts them.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	var opts options
	flag.StringVar(&opts.nriSocket, "nri-socket", "/var/run/nri/nri.sock", "the runtime's NRI socket")
	flag.StringVar(&opts.agentSocket, "agent-socket", "/var/run/gpuconf/agent.sock", "the node agent's hook socket")
	flag.StringVar(&opts.name, "name", "gpuconf", "the plugin name registered with NRI")
	flag.StringVar(&opts.idx, "idx", "50", "the plugin index (order among NRI plugins)")
	flag.DurationVar(&opts.agentTimeout, "agent-timeout", 5*time.Second,
		"how long one agent request may take (at most 3/4 of the runtime's plugin_request_timeout: lowered to that)")
	flag.DurationVar(&opts.heartbeat, "heartbeat", time.Second, "how often the registration is reported to the agent")
	flag.DurationVar(&opts.retry, "reconnect", time.Second, "wait before connecting to the runtime again")
	flag.Parse()
	log.SetFlags(log.LstdFlags | log.Lmicroseconds | log.LUTC)
	log.SetPrefix("gpuconf-nri-plugin: ")

	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	p := newPlugin(opts, newAgentClient(opts.agentSocket, opts.agentTimeout))
	if err := p.run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "gpuconf-nri-plugin:", err)
		os.Exit(1)
	}
}

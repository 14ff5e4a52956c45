package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
)

// placementPrefix is enforcement/contract.py's NVIDIA_PREFIX: a container with a key
// "nvidia.com/container.<name>.<suffix>" on its Pod is fractional (refused when the agent is away).
const placementPrefix = "nvidia.com/container."

type options struct {
	nriSocket, agentSocket, name, idx string
	agentTimeout, heartbeat, retry    time.Duration
}

type agent interface {
	call(request map[string]any) (*reply, error)
	limit(runtimeTimeout time.Duration) time.Duration
}

type tracked struct {
	info    containerInfo
	running bool
}

type plugin struct {
	opts  options
	agent agent

	stub stub.Stub // the current connection's, for the runtime's request timeout

	mu          sync.Mutex
	containers  map[string]*tracked // by container id
	registered  bool
	runtime     string
	needSync    bool   // a request did not reach the agent, or it restarted: send Synchronize
	incarnation string // the agent's, as of its last answer
}

func newPlugin(opts options, a agent) *plugin {
	return &plugin{opts: opts, agent: a, containers: map[string]*tracked{}, needSync: true}
}

func sandboxOf(pod *api.PodSandbox) sandbox {
	if pod == nil {
		return sandbox{}
	}
	return sandbox{
		Name: pod.GetName(), Namespace: pod.GetNamespace(), UID: pod.GetUid(),
		Annotations: pod.GetAnnotations(), Labels: pod.GetLabels(),
	}
}

func fractional(pod *api.PodSandbox, container string) bool {
	prefix := placementPrefix + container + "."
	for key := range pod.GetAnnotations() {
		if strings.HasPrefix(key, prefix) {
			return true
		}
	}
	return false
}

// ---- NRI handlers

func (p *plugin) Configure(_ context.Context, _, runtime, version string) (stub.EventMask, error) {
	p.mu.Lock()
	p.runtime = runtime + " " + version
	s := p.stub
	p.mu.Unlock()
	var requestTimeout time.Duration
	if s != nil {
		requestTimeout = s.RequestTimeout()
	}
	log.Printf("configured by %s %s (request timeout %s; agent requests time out after %s)",
		runtime, version, requestTimeout, p.agent.limit(requestTimeout))
	return 0, nil // 0: every event implemented here
}

func (p *plugin) Synchronize(_ context.Context, pods []*api.PodSandbox, ctrs []*api.Container) ([]*api.ContainerUpdate, error) {
	byID := map[string]*api.PodSandbox{}
	for _, pod := range pods {
		byID[pod.GetId()] = pod
	}
	p.mu.Lock()
	p.containers = map[string]*tracked{}
	for _, ctr := range ctrs {
		running := ctr.GetState() == api.ContainerState_CONTAINER_RUNNING
		p.containers[ctr.GetId()] = &tracked{
			info:    containerInfo{Sandbox: sandboxOf(byID[ctr.GetPodSandboxId()]), Container: ctr.GetName(), Pid: ctr.GetPid()},
			running: running,
		}
	}
	p.registered = true
	p.needSync = true
	p.mu.Unlock()
	log.Printf("registered with the runtime: %d pod(s), %d container(s)", len(pods), len(ctrs))
	p.syncAgent()
	p.report()
	return nil, nil
}

func (p *plugin) CreateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	info := containerInfo{Sandbox: sandboxOf(pod), Container: ctr.GetName()}
	answer, err := p.agent.call(map[string]any{"op": "CreateContainer", "sandbox": info.Sandbox, "container": info.Container})
	if err != nil {
		var down unavailable
		if !errors.As(err, &down) {
			return nil, nil, err
		}
		p.markUnsynced()
		if fractional(pod, ctr.GetName()) {
			msg := fmt.Sprintf("gpuconf NRI plugin: %v; container %q of Pod %s/%s has GPU fraction annotations: not started (fail closed)",
				err, ctr.GetName(), pod.GetNamespace(), pod.GetName())
			log.Print(msg)
			return nil, nil, errors.New(msg)
		}
		log.Printf("%v; container %q of Pod %s/%s has no GPU fraction annotations: started untouched",
			err, ctr.GetName(), pod.GetNamespace(), pod.GetName())
		p.track(ctr.GetId(), info)
		return nil, nil, nil
	}
	if !answer.Allowed {
		reason := answer.Reason
		if reason == "" {
			reason = "refused"
		}
		return nil, nil, fmt.Errorf("%s: %s", reason, answer.Message)
	}
	p.track(ctr.GetId(), info)
	if len(answer.Env) == 0 && len(answer.Mounts) == 0 {
		return nil, nil, nil
	}
	adjust := &api.ContainerAdjustment{}
	keys := make([]string, 0, len(answer.Env))
	for key := range answer.Env {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	for _, key := range keys {
		adjust.AddEnv(key, answer.Env[key]) // replaces the container's own value of key
	}
	for _, m := range answer.Mounts {
		opts := m.Options
		if len(opts) == 0 {
			opts = []string{"rbind", "rw"}
		}
		adjust.AddMount(&api.Mount{Source: m.Source, Destination: m.Destination, Type: "bind", Options: opts})
	}
	return adjust, nil, nil
}

// track remembers a created container, for the Synchronize a restarted agent gets.
func (p *plugin) track(id string, info containerInfo) {
	p.mu.Lock()
	p.containers[id] = &tracked{info: info}
	p.mu.Unlock()
}

func (p *plugin) PostStartContainer(_ context.Context, _ *api.PodSandbox, ctr *api.Container) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if t := p.containers[ctr.GetId()]; t != nil {
		t.running = true
		t.info.Pid = ctr.GetPid()
	}
	return nil
}

func (p *plugin) StopContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) ([]*api.ContainerUpdate, error) {
	p.mu.Lock()
	if t := p.containers[ctr.GetId()]; t != nil {
		t.running = false
	}
	p.mu.Unlock()
	p.stopped(pod, ctr)
	return nil, nil
}

func (p *plugin) RemoveContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) error {
	p.mu.Lock()
	delete(p.containers, ctr.GetId())
	p.mu.Unlock()
	p.stopped(pod, ctr) // a release is idempotent: a container removed without a stop is released too
	return nil
}

func (p *plugin) stopped(pod *api.PodSandbox, ctr *api.Container) {
	request := map[string]any{"op": "StopContainer", "sandbox": sandboxOf(pod), "container": ctr.GetName()}
	if ctr.GetState() == api.ContainerState_CONTAINER_STOPPED {
		request["exit_code"] = ctr.GetExitCode()
	}
	if _, err := p.agent.call(request); err != nil {
		log.Printf("%v; the release of %s/%s[%s] waits for the next Synchronize", err, pod.GetNamespace(), pod.GetName(), ctr.GetName())
		p.markUnsynced()
	}
}

func (p *plugin) onClose() {
	p.mu.Lock()
	p.registered = false
	p.mu.Unlock()
	log.Print("connection to the runtime closed: not registered")
	p.report()
}

func (p *plugin) markUnsynced() {
	p.mu.Lock()
	p.needSync = true
	p.mu.Unlock()
}

// ---- towards the agent

// syncAgent sends the agent the containers that run (when it needs them); true when it did.
func (p *plugin) syncAgent() bool {
	p.mu.Lock()
	if !p.needSync || !p.registered {
		p.mu.Unlock()
		return false
	}
	running := []containerInfo{}
	for _, t := range p.containers {
		if t.running {
			running = append(running, t.info)
		}
	}
	p.mu.Unlock()
	answer, err := p.agent.call(map[string]any{"op": "Synchronize", "containers": running})
	if err != nil {
		log.Printf("Synchronize not delivered: %v", err)
		return false
	}
	p.mu.Lock()
	p.needSync = false
	p.incarnation = answer.Incarnation
	p.mu.Unlock()
	log.Printf("Synchronize delivered: %d running container(s)", len(running))
	return true
}

// report tells the agent whether the plugin is registered; a new agent incarnation gets a Synchronize.
func (p *plugin) report() {
	p.mu.Lock()
	status := map[string]any{
		"op": "PluginStatus", "registered": p.registered, "plugin": p.opts.name,
		"runtime": p.runtime, "nri_socket": p.opts.nriSocket, "pid": os.Getpid(),
	}
	p.mu.Unlock()
	answer, err := p.agent.call(status)
	if err != nil {
		p.markUnsynced()
		return
	}
	p.mu.Lock()
	if answer.Incarnation != p.incarnation {
		p.needSync = true
	}
	p.mu.Unlock()
	p.syncAgent()
}

func (p *plugin) heartbeat(ctx context.Context) {
	ticker := time.NewTicker(p.opts.heartbeat)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
			p.report()
		}
	}
}

// run connects to the runtime until ctx ends, again after every lost connection.
func (p *plugin) run(ctx context.Context) error {
	go p.heartbeat(ctx)
	for ctx.Err() == nil {
		s, err := stub.New(p,
			stub.WithPluginName(p.opts.name),
			stub.WithPluginIdx(p.opts.idx),
			stub.WithSocketPath(p.opts.nriSocket),
			stub.WithOnClose(p.onClose),
		)
		if err != nil {
			return fmt.Errorf("cannot create the NRI stub: %w", err)
		}
		p.mu.Lock()
		p.stub = s
		p.mu.Unlock()
		if err := s.Run(ctx); err != nil && ctx.Err() == nil {
			log.Printf("NRI connection to %s: %v; connecting again in %s", p.opts.nriSocket, err, p.opts.retry)
		}
		p.mu.Lock()
		p.registered = false
		p.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-time.After(p.opts.retry):
		}
	}
	p.report() // a stopping plugin says so at once: the agent's condition turns False
	return nil
}

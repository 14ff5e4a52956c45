package main

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
)

type fakeAgent struct {
	answer   *reply
	err      error
	requests []map[string]any
}

func (f *fakeAgent) call(request map[string]any) (*reply, error) {
	f.requests = append(f.requests, request)
	return f.answer, f.err
}

func (f *fakeAgent) limit(time.Duration) time.Duration { return 0 }

func TestAgentRequestsStayBelowTheRuntimesTimeout(t *testing.T) {
	c := newAgentClient("/nowhere", 5*time.Second)
	if got := c.limit(2 * time.Second); got != 1500*time.Millisecond {
		t.Fatalf("under containerd's default 2s: %s", got)
	}
	if got := newAgentClient("/nowhere", 5*time.Second).limit(10 * time.Second); got != 5*time.Second {
		t.Fatalf("under 10s: %s", got)
	}
}

func pod(annotations map[string]string) *api.PodSandbox {
	return &api.PodSandbox{Id: "s1", Name: "p", Namespace: "ns", Uid: "u1", Annotations: annotations}
}

var placed = map[string]string{"nvidia.com/container.main.gpu-memory.request": "1Gi"}

func TestAllowedBecomesEnvAndBindMounts(t *testing.T) {
	agent := &fakeAgent{answer: &reply{Allowed: true, Env: map[string]string{"B": "2", "A": "1"},
		Mounts: []mount{{Source: "/pipe", Destination: "/pipe"}}}}
	p := newPlugin(options{}, agent)
	adjust, _, err := p.CreateContainer(nil, pod(placed), &api.Container{Id: "c1", Name: "main"})
	if err != nil {
		t.Fatal(err)
	}
	if len(adjust.Env) != 2 || adjust.Env[0].Key != "A" || adjust.Env[1].Value != "2" {
		t.Fatalf("env %v", adjust.Env)
	}
	if m := adjust.Mounts[0]; m.Source != "/pipe" || m.Destination != "/pipe" || m.Type != "bind" {
		t.Fatalf("mount %v", m)
	}
	sent := agent.requests[0]
	if sent["op"] != "CreateContainer" || sent["container"] != "main" || sent["sandbox"].(sandbox).UID != "u1" {
		t.Fatalf("request %v", sent)
	}
}

func TestRefusalCarriesTheAgentsMessage(t *testing.T) {
	agent := &fakeAgent{answer: &reply{Reason: "CreateContainerConfigError", Message: "key k: bad [rule]"}}
	_, _, err := newPlugin(options{}, agent).CreateContainer(nil, pod(placed), &api.Container{Name: "main"})
	if err == nil || err.Error() != "CreateContainerConfigError: key k: bad [rule]" {
		t.Fatalf("err %v", err)
	}
}

func TestAgentDownFailsClosedForFractionsOnly(t *testing.T) {
	agent := &fakeAgent{err: unavailable{errors.New("node agent hook x did not answer")}}
	p := newPlugin(options{}, agent)
	_, _, err := p.CreateContainer(nil, pod(placed), &api.Container{Name: "main"})
	if err == nil || !strings.Contains(err.Error(), "fail closed") {
		t.Fatalf("fractional: %v", err)
	}
	// Another container of the same Pod has no keys of its own: untouched.
	adjust, _, err := p.CreateContainer(nil, pod(placed), &api.Container{Name: "sidecar"})
	if err != nil || adjust != nil {
		t.Fatalf("unannotated: %v %v", adjust, err)
	}
}

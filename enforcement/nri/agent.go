package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"sync/atomic"
	"time"
)

// The hook protocol of enforcement/hook.py: one JSON request and one JSON reply (one line each)
// per connection on a Unix socket.

// sandbox is what the plugin forwards of NRI's PodSandbox; the agent builds the Pod from it.
type sandbox struct {
	Name        string            `json:"name"`
	Namespace   string            `json:"namespace"`
	UID         string            `json:"uid"`
	Annotations map[string]string `json:"annotations"`
	Labels      map[string]string `json:"labels"`
}

type containerInfo struct {
	Sandbox   sandbox `json:"sandbox"`
	Container string  `json:"container"`
	Pid       uint32  `json:"pid"`
}

type mount struct {
	Source      string   `json:"source"`
	Destination string   `json:"destination"`
	Options     []string `json:"options"`
}

type reply struct {
	Error       string            `json:"error"`
	Allowed     bool              `json:"allowed"`
	Env         map[string]string `json:"env"`
	Mounts      []mount           `json:"mounts"`
	Reason      string            `json:"reason"`
	Message     string            `json:"message"`
	Incarnation string            `json:"incarnation"`
}

// unavailable: the agent did not answer (or answered with a protocol error).
type unavailable struct{ err error }

func (u unavailable) Error() string { return u.err.Error() }

type agentClient struct {
	path    string
	timeout atomic.Int64 // nanoseconds
}

func newAgentClient(path string, timeout time.Duration) *agentClient {
	c := &agentClient{path: path}
	c.timeout.Store(int64(timeout))
	return c
}

// limit keeps one agent request below the runtime's own request timeout: a plugin that answers
// containerd late is dropped by it, while an agent that answers the plugin late only refuses a
// fractional container (fail closed) and leaves the plugin registered.
func (c *agentClient) limit(runtimeTimeout time.Duration) time.Duration {
	if runtimeTimeout <= 0 {
		return time.Duration(c.timeout.Load())
	}
	ceiling := runtimeTimeout - runtimeTimeout/4
	if time.Duration(c.timeout.Load()) > ceiling {
		c.timeout.Store(int64(ceiling))
	}
	return time.Duration(c.timeout.Load())
}

func (c *agentClient) call(request map[string]any) (*reply, error) {
	data, err := json.Marshal(request)
	if err != nil {
		return nil, err
	}
	timeout := time.Duration(c.timeout.Load())
	conn, err := net.DialTimeout("unix", c.path, timeout)
	if err != nil {
		return nil, unavailable{fmt.Errorf("node agent hook %s did not answer: %w", c.path, err)}
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(timeout))
	if _, err := conn.Write(append(data, '\n')); err != nil {
		return nil, unavailable{fmt.Errorf("node agent hook %s: %w", c.path, err)}
	}
	reader := bufio.NewReaderSize(conn, 1<<16)
	line, err := reader.ReadBytes('\n')
	if err != nil && len(line) == 0 {
		return nil, unavailable{fmt.Errorf("node agent hook %s did not answer: %w", c.path, err)}
	}
	var out reply
	if err := json.Unmarshal(line, &out); err != nil {
		return nil, unavailable{fmt.Errorf("node agent hook %s: unreadable reply: %w", c.path, err)}
	}
	if out.Error != "" {
		return nil, unavailable{fmt.Errorf("node agent hook %s failed: %s", c.path, out.Error)}
	}
	return &out, nil
}

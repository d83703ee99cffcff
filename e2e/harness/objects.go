package harness

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Apply creates every object of a multi-document YAML text (or updates its status when the
// document has one and the object was just created, as `kubectl apply --subresource=status`).
func Apply(ctx context.Context, c client.Client, text string) error {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewBufferString(text), 4096)
	for {
		obj := &unstructured.Unstructured{}
		if err := dec.Decode(&obj.Object); err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
		if len(obj.Object) == 0 {
			continue
		}
		status, hasStatus := obj.Object["status"]
		if err := c.Create(ctx, obj); err != nil {
			return fmt.Errorf("create %s %s: %w", obj.GetKind(), obj.GetName(), err)
		}
		if hasStatus {
			obj.Object["status"] = status
			if err := c.Status().Update(ctx, obj); err != nil {
				return fmt.Errorf("status of %s %s: %w", obj.GetKind(), obj.GetName(), err)
			}
		}
	}
}

// Get reads one object.
func Get(ctx context.Context, c client.Client, apiVersion, kind, ns, name string) (*unstructured.Unstructured, error) {
	obj := &unstructured.Unstructured{}
	obj.SetAPIVersion(apiVersion)
	obj.SetKind(kind)
	err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, obj)
	return obj, err
}

// List lists objects of a kind in ns ("" = all).
func List(ctx context.Context, c client.Client, apiVersion, kind, ns string) ([]unstructured.Unstructured, error) {
	l := &unstructured.UnstructuredList{}
	l.SetAPIVersion(apiVersion)
	l.SetKind(kind + "List")
	var opts []client.ListOption
	if ns != "" {
		opts = append(opts, client.InNamespace(ns))
	}
	err := c.List(ctx, l, opts...)
	return l.Items, err
}

// Condition returns status, reason and message of the condition type of obj.
func Condition(obj *unstructured.Unstructured, typ string) (status, reason, message string) {
	conds, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == typ {
			s, _ := m["status"].(string)
			r, _ := m["reason"].(string)
			msg, _ := m["message"].(string)
			return s, r, msg
		}
	}
	return "", "", ""
}

// EnsureNamespace creates ns if it does not exist.
func EnsureNamespace(ctx context.Context, c client.Client, ns string) error {
	obj := &unstructured.Unstructured{}
	obj.SetAPIVersion("v1")
	obj.SetKind("Namespace")
	obj.SetName(ns)
	if err := c.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}

// Forwarder relays TCP connections from its own loopback port to target, byte for byte
// (TLS stays end to end): another address for the same API server, so client-go sees
// another cluster.
type Forwarder struct {
	Addr  string
	ln    net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns map[net.Conn]bool
}

// StartForwarder listens on a fresh port of NodeIP, where the node's pods reach it too.
func StartForwarder(target string) (*Forwarder, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(NodeIP, "0"))
	if err != nil {
		return nil, err
	}
	f := &Forwarder{Addr: ln.Addr().String(), ln: ln, conns: map[net.Conn]bool{}}
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			f.wg.Add(1)
			go func() {
				defer f.wg.Done()
				defer in.Close()
				out, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer out.Close()
				f.track(in, true)
				defer f.track(in, false)
				done := make(chan struct{}, 2)
				go func() { _, _ = io.Copy(out, in); done <- struct{}{} }()
				go func() { _, _ = io.Copy(in, out); done <- struct{}{} }()
				<-done
			}()
		}
	}()
	return f, nil
}

func (f *Forwarder) track(c net.Conn, open bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if open {
		f.conns[c] = true
	} else {
		delete(f.conns, c)
	}
}

// Cut closes every relayed connection (as a network blip or a load balancer would): the
// client reconnects; returns how many were open.
func (f *Forwarder) Cut() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := len(f.conns)
	for c := range f.conns {
		_ = c.Close()
	}
	return n
}

// Close stops accepting (open relays end with their peers).
func (f *Forwarder) Close() { _ = f.ln.Close() }

func yamlToObj(doc string, obj *unstructured.Unstructured) error {
	return utilyaml.NewYAMLOrJSONDecoder(bytes.NewBufferString(doc), 4096).Decode(&obj.Object)
}

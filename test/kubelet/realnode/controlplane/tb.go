package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"testing"

	"k8s.io/klog/v2"
)

// errFatal is what Fatal panics with; main recovers it, runs the cleanups and exits 1.
var errFatal = errors.New("fatal")

// processTB is the process's own testing.TB, for the harness's test helpers that start the API
// server and etcd (they take one): logs go to klog, Cleanup functions run (last first) when
// the process stops, Fatal stops it. testing.TB cannot be implemented outside package testing
// (an unexported method), so the interface is embedded, nil: every exported method is defined
// here, and the unexported one is never called.
type processTB struct {
	testing.TB
	mu       sync.Mutex
	cleanups []func()
	failed   bool
	ctx      context.Context
	cancel   context.CancelFunc
}

func newProcessTB() *processTB {
	ctx, cancel := context.WithCancel(context.Background())
	return &processTB{ctx: ctx, cancel: cancel}
}

func (t *processTB) runCleanups() {
	t.cancel()
	for {
		t.mu.Lock()
		n := len(t.cleanups)
		if n == 0 {
			t.mu.Unlock()
			return
		}
		f := t.cleanups[n-1]
		t.cleanups = t.cleanups[:n-1]
		t.mu.Unlock()
		f()
	}
}

func (t *processTB) Attr(key, value string) {}
func (t *processTB) Chdir(dir string) {
	if err := os.Chdir(dir); err != nil {
		t.Fatal(err)
	}
}
func (t *processTB) Cleanup(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cleanups = append(t.cleanups, f)
}
func (t *processTB) Context() context.Context { return t.ctx }
func (t *processTB) ArtifactDir() string      { return t.TempDir() }
func (t *processTB) Error(args ...any)        { klog.ErrorDepth(1, args...); t.Fail() }
func (t *processTB) Errorf(f string, args ...any) {
	klog.ErrorDepth(1, fmt.Sprintf(f, args...))
	t.Fail()
}
func (t *processTB) Fail() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.failed = true
}
func (t *processTB) FailNow() { t.Fail(); panic(errFatal) }
func (t *processTB) Failed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.failed
}
func (t *processTB) Fatal(args ...any) { klog.ErrorDepth(1, args...); t.FailNow() }
func (t *processTB) Fatalf(f string, args ...any) {
	klog.ErrorDepth(1, fmt.Sprintf(f, args...))
	t.FailNow()
}
func (t *processTB) Helper()                    {}
func (t *processTB) Log(args ...any)            { klog.InfoDepth(1, args...) }
func (t *processTB) Logf(f string, args ...any) { klog.InfoDepth(1, fmt.Sprintf(f, args...)) }
func (t *processTB) Name() string               { return "real-node-control-plane" }
func (t *processTB) Output() io.Writer          { return os.Stderr }
func (t *processTB) Setenv(key, value string) {
	if err := os.Setenv(key, value); err != nil {
		t.Fatal(err)
	}
}
func (t *processTB) Skip(args ...any)            { t.Fatal(append([]any{"skip: "}, args...)...) }
func (t *processTB) Skipf(f string, args ...any) { t.Fatalf("skip: "+f, args...) }
func (t *processTB) SkipNow()                    { t.Fatal("skip") }
func (t *processTB) Skipped() bool               { return false }

// TempDir is a new directory under $TMPDIR, removed at the end.
func (t *processTB) TempDir() string {
	d, err := os.MkdirTemp("", "real-node-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(d) })
	return d
}

package kubelet

import (
	"os"
	"strconv"
	"testing"
	"time"
)

// EnvInt: the positive integer the environment variable name holds, def when it is unset or
// empty; anything else fails the test, naming the variable.
func EnvInt(t testing.TB, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// EnvDuration: the positive duration (time.ParseDuration) the environment variable name holds,
// def when it is unset or empty; anything else fails the test, naming the variable.
func EnvDuration(t testing.TB, name string, def time.Duration) time.Duration {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("%s=%q: want a positive duration (e.g. 10m)", name, v)
	}
	return d
}

// Package kubelet is the kubelet conformance harness: it runs the kubelet's own device manager,
// Topology Manager and pod-resources server from k8s.io/kubernetes (pinned in go.mod) against
// the built rdma-device-plugin binary, with a GPU device plugin beside it, on a fixture node.
// The scenarios are the tests in this directory; run.sh runs them. See docs/conformance.md.
package kubelet

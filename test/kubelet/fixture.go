package kubelet

import (
	"encoding/xml"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// Node is what the harness knows of a fixture node: read from the hwloc XML export that the
// plugin is also given (--topology-xml), so the GPU plugin, the Topology Manager and our
// plugin all see one machine.
type Node struct {
	XML       string
	NUMANodes []int      // the NUMA nodes that have CPUs: the Topology Manager's machine
	NUMA      []NUMANode // every NUMA node, CPU-less ones included, by ID
	GPUs      []GPU
	HCAs      []HCA
}

// NUMANode is one NUMA node of the fixture, decided as topology/internal/hwloc_tree.cc decides.
type NUMANode struct {
	ID      int
	HasCPUs bool   // false: memory alone (GPU memory on Grace, MIG reserve, CXL, HBM)
	CPUs    string // its cpuset as a kernel cpulist ("0-71"); "" when it has no CPUs
}

// GPU is one GPU of the fixture; its device-plugin ID is its PCI address.
type GPU struct {
	PCI      string
	NUMA     int      // the CPU NUMA node its locality names, -1 when none or several
	PCIeRoot string   // pci0000:15
	Bridges  []string // bridge BDFs from the root port down to the GPU's parent
	Vendor   string   // 10de
	Device   string   // 2330
	Class    string   // 0302
}

// HCA is one RDMA device of the fixture, with what the sysfs layout needs.
type HCA struct {
	Name      string
	PCI       string
	NUMA      int
	PCIeRoot  string   // pci0000:15
	Bridges   []string // bridge BDFs from the root port down to the HCA's parent
	Ports     []int
	PortState map[int]string // ACTIVE, DOWN, ...
	Netdevs   []string
	NoPorts   bool   // the XML had no Port<N>State: one default InfiniBand port
	Vendor    string // PCI vendor ID of its function, "15b3"
	Device    string // PCI device ID, "1021"
	NodeGUID  string // the export's NodeGUID; "" when it has none
}

// Ethernet reports whether the HCA is RoCE, decided as topology/sysfs_fixture.cc decides it:
// a first netdev not named ib* means Ethernet, unless the export knew no ports (then the
// fixture's default port, InfiniBand); RoCE HCAs get no umad/issm.
func (h HCA) Ethernet() bool {
	return !h.NoPorts && len(h.Netdevs) > 0 && !strings.HasPrefix(h.Netdevs[0], "ib")
}

type xmlInfo struct {
	Name  string `xml:"name,attr"`
	Value string `xml:"value,attr"`
}

type xmlObject struct {
	Type           string      `xml:"type,attr"`
	Name           string      `xml:"name,attr"`
	Subtype        string      `xml:"subtype,attr"`
	OSIndex        string      `xml:"os_index,attr"`
	CPUSet         string      `xml:"cpuset,attr"`
	CompleteCPUSet string      `xml:"complete_cpuset,attr"`
	Nodeset        string      `xml:"nodeset,attr"`
	BusID          string      `xml:"pci_busid,attr"`
	PCIType        string      `xml:"pci_type,attr"`
	OSDevType      string      `xml:"osdev_type,attr"`
	BridgeType     string      `xml:"bridge_type,attr"`
	BridgePCI      string      `xml:"bridge_pci,attr"`
	Infos          []xmlInfo   `xml:"info"`
	Children       []xmlObject `xml:"object"`
}

// LoadNode reads an hwloc 2 XML export.
func LoadNode(path string) (*Node, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var top struct {
		Objects []xmlObject `xml:"object"`
	}
	if err := xml.Unmarshal(data, &top); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	n := &Node{XML: path}
	w := walker{node: n, cpuless: cpulessNodes(top.Objects)}
	for _, o := range top.Objects {
		w.walk(o, nil, "", nil)
	}
	sort.Slice(n.NUMA, func(i, j int) bool { return n.NUMA[i].ID < n.NUMA[j].ID })
	for _, m := range n.NUMA {
		if m.HasCPUs {
			n.NUMANodes = append(n.NUMANodes, m.ID)
		}
	}
	sort.Slice(n.GPUs, func(i, j int) bool { return n.GPUs[i].PCI < n.GPUs[j].PCI })
	sort.Slice(n.HCAs, func(i, j int) bool { return n.HCAs[i].PCI < n.HCAs[j].PCI })
	if len(n.HCAs) == 0 {
		return nil, fmt.Errorf("%s: no OpenFabrics devices", path)
	}
	return n, nil
}

type walker struct {
	node    *Node
	cpuless map[int]bool // NUMA nodes without CPUs
}

// bitmap parses an hwloc bitmap: "0x0000ffff,0xffffffff", 32-bit words most significant first.
func bitmap(text string) *big.Int {
	v := new(big.Int)
	for _, word := range strings.Split(text, ",") {
		w, err := strconv.ParseUint(strings.TrimPrefix(word, "0x"), 16, 32)
		if err != nil {
			return new(big.Int)
		}
		v.Lsh(v, 32).Or(v, new(big.Int).SetUint64(w))
	}
	return v
}

// cpulist spells a bitmap as the kernel's cpulist files do: "0-71", "0,2-3"; "" when empty.
func cpulist(v *big.Int) string {
	var parts []string
	for i := 0; i < v.BitLen(); i++ {
		if v.Bit(i) == 0 {
			continue
		}
		j := i
		for j+1 < v.BitLen() && v.Bit(j+1) == 1 {
			j++
		}
		if j == i {
			parts = append(parts, strconv.Itoa(i))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", i, j))
		}
		i = j
	}
	return strings.Join(parts, ",")
}

// memoryOnlyKind reports whether hwloc's subtype of a NUMA node names memory that has no CPUs,
// as topology/internal/hwloc_tree.cc's list does.
func memoryOnlyKind(subtype string) bool {
	switch subtype {
	case "GPUMemory", "MCDRAM", "HBM", "NVM", "SPM":
		return true
	}
	return strings.HasPrefix(subtype, "CXL-")
}

// numaObject is a NUMANode of the XML and where it hangs: the serials of the objects from the
// root down to the object it is attached to.
type numaObject struct {
	id      int
	cpus    *big.Int
	kind    bool // memoryOnlyKind or an empty complete cpuset
	parents []int
}

// cpulessNodes decides which NUMA nodes have no CPUs, by topology/internal/hwloc_tree.cc's rules:
// an empty complete cpuset, a memory-only subtype (GPUMemory, ...), or a cpuset whose every CPU
// belongs to NUMA nodes with CPUs attached deeper below its own parent (hwloc attaches a node
// with CPUs to the smallest object holding them, and nodes' CPUs never overlap on Linux: one
// attached higher over theirs was attached by something else, like the Machine for the nodes a
// Grace GPU's driver keeps for MIG).
func cpulessNodes(objects []xmlObject) map[int]bool {
	var nodes []numaObject
	serial := 0
	var visit func(o xmlObject, parents []int)
	visit = func(o xmlObject, parents []int) {
		serial++
		here := append(append([]int(nil), parents...), serial)
		for _, c := range o.Children {
			if c.Type != "NUMANode" {
				visit(c, here)
				continue
			}
			id, err := strconv.Atoi(c.OSIndex)
			if err != nil {
				continue
			}
			complete := c.CompleteCPUSet
			if complete == "" {
				complete = c.CPUSet
			}
			nodes = append(nodes, numaObject{id: id, cpus: bitmap(c.CPUSet), parents: here,
				kind: memoryOnlyKind(c.Subtype) || bitmap(complete).Sign() == 0})
		}
	}
	for _, o := range objects {
		visit(o, nil)
	}
	out := map[int]bool{}
	for _, n := range nodes {
		if n.kind {
			out[n.id] = true
			continue
		}
		parent := n.parents[len(n.parents)-1]
		below := new(big.Int)
		for _, m := range nodes {
			if m.kind || len(m.parents) <= len(n.parents) || m.parents[len(n.parents)-1] != parent {
				continue
			}
			below.Or(below, m.cpus)
		}
		if n.cpus.Sign() != 0 && new(big.Int).AndNot(n.cpus, below).Sign() == 0 {
			out[n.id] = true
		}
	}
	return out
}

// cpuNUMA is the one NUMA node with CPUs in a nodeset (an object's locality), or -1.
func (w *walker) cpuNUMA(nodeset *big.Int) int {
	found := -1
	for i := 0; i < nodeset.BitLen(); i++ {
		if nodeset.Bit(i) == 0 || w.cpuless[i] {
			continue
		}
		if found >= 0 {
			return -1
		}
		found = i
	}
	return found
}

func (w *walker) walk(o xmlObject, nodeset *big.Int, root string, bridges []string) {
	numa := -1
	if nodeset != nil {
		numa = w.cpuNUMA(nodeset)
	}
	switch o.Type {
	case "NUMANode":
		if id, err := strconv.Atoi(o.OSIndex); err == nil {
			m := NUMANode{ID: id, HasCPUs: !w.cpuless[id]}
			if m.HasCPUs {
				m.CPUs = cpulist(bitmap(o.CPUSet))
			}
			w.node.NUMA = append(w.node.NUMA, m)
		}
	case "Machine", "Package", "Group", "Die", "L3Cache", "L2Cache":
		if o.Nodeset != "" {
			nodeset = bitmap(o.Nodeset)
		}
	case "Bridge":
		if o.BridgeType == "0-1" || o.BusID == "" { // host bridge: bridge_pci="0000:[15-1b]"
			if i := strings.Index(o.BridgePCI, ":["); i > 0 && len(o.BridgePCI) >= i+4 {
				root = "pci" + o.BridgePCI[:i] + ":" + o.BridgePCI[i+2:i+4]
			}
		} else {
			bridges = append(append([]string(nil), bridges...), o.BusID)
		}
	case "PCIDev":
		w.pciDevice(o, numa, root, bridges)
	}
	for _, c := range o.Children {
		w.walk(c, nodeset, root, bridges)
	}
}

func (w *walker) pciDevice(o xmlObject, numa int, root string, bridges []string) {
	fields := strings.Fields(o.PCIType) // "0302 [10de:2330] [10de:16c1] a1"
	class, id := "", ""
	if len(fields) >= 2 {
		class, id = fields[0], strings.Trim(fields[1], "[]")
	}
	vendor, _, _ := strings.Cut(id, ":")
	// As topology/discovery.h decides: 3D controllers from anyone, VGA/other display/processing
	// accelerators from GPU vendors, never the ATI ES1000 BMC VGA.
	gpuClass := class == "0302" || ((class == "0300" || class == "0380" || class == "1200") &&
		(vendor == "10de" || vendor == "1002") && id != "1002:515e")
	if gpuClass {
		gpuRoot := root
		if gpuRoot == "" {
			gpuRoot = "pci" + o.BusID[:7]
		}
		device := strings.TrimPrefix(id, vendor+":")
		w.node.GPUs = append(w.node.GPUs, GPU{PCI: o.BusID, NUMA: numa, PCIeRoot: gpuRoot,
			Bridges: bridges, Vendor: vendor, Device: device, Class: class})
	}
	var hca *HCA
	var netdevs []string
	for _, c := range o.Children {
		if c.Type != "OSDev" {
			continue
		}
		switch c.OSDevType {
		case "2":
			netdevs = append(netdevs, c.Name)
		case "3":
			h := HCA{Name: c.Name, PCI: o.BusID, NUMA: numa, PCIeRoot: root,
				Bridges: bridges, PortState: map[int]string{}, Vendor: vendor,
				Device: strings.TrimPrefix(id, vendor+":")}
			for _, in := range c.Infos {
				if in.Name == "NodeGUID" {
					h.NodeGUID = in.Value
				}
				var port int
				if _, err := fmt.Sscanf(in.Name, "Port%dState", &port); err == nil &&
					strings.HasSuffix(in.Name, "State") {
					h.Ports = append(h.Ports, port)
					h.PortState[port] = portStateName(in.Value)
				}
			}
			if len(h.Ports) == 0 {
				h.Ports = []int{1}
				h.PortState[1] = "ACTIVE"
				h.NoPorts = true
			}
			sort.Ints(h.Ports)
			hca = &h
		}
	}
	if hca != nil {
		hca.Netdevs = netdevs
		if hca.PCIeRoot == "" {
			hca.PCIeRoot = "pci" + hca.PCI[:7]
		}
		w.node.HCAs = append(w.node.HCAs, *hca)
	}
}

func portStateName(v string) string {
	switch v {
	case "1":
		return "DOWN"
	case "2":
		return "INIT"
	case "3":
		return "ARMED"
	case "5":
		return "ACTIVE_DEFER"
	}
	return "ACTIVE"
}

// GPUsOn returns the PCI addresses of the GPUs on one NUMA node.
func (n *Node) GPUsOn(numa int) []string {
	var out []string
	for _, g := range n.GPUs {
		if g.NUMA == numa {
			out = append(out, g.PCI)
		}
	}
	return out
}

// GPUByPCI finds a GPU by its device-plugin ID.
func (n *Node) GPUByPCI(pci string) (GPU, bool) {
	for _, g := range n.GPUs {
		if g.PCI == pci {
			return g, true
		}
	}
	return GPU{}, false
}

// SameSwitch reports whether a GPU and an HCA sit under one PCIe switch: their bridge chains
// share the root port and the first switch's upstream port (nvidia-smi's PIX where there is one
// level of switches; below a top-level switch, PIX or PXB).
func SameSwitch(g GPU, h HCA) bool {
	return len(g.Bridges) >= 2 && len(h.Bridges) >= 2 &&
		g.Bridges[0] == h.Bridges[0] && g.Bridges[1] == h.Bridges[1]
}

// Near reports whether an HCA is at PIX or PXB to a GPU, the classes at which GPUDirect RDMA
// performs well, drawn as topology/topology.cc's Classify draws them: the same PCIe root and at
// least one bridge in common (the root port), so that the path never crosses the host bridge.
// PIX or PXB then only counts the switches on the path.
func Near(g GPU, h HCA) bool {
	return g.PCIeRoot == h.PCIeRoot && len(g.Bridges) > 0 && len(h.Bridges) > 0 &&
		g.Bridges[0] == h.Bridges[0]
}

// HCAByPCI finds an HCA by its device-plugin ID in exclusive mode.
func (n *Node) HCAByPCI(pci string) (HCA, bool) {
	for _, h := range n.HCAs {
		if h.PCI == pci {
			return h, true
		}
	}
	return HCA{}, false
}

// Sysfs is a fake sysfs + /dev tree, laid out exactly as topology/sysfs_fixture.h documents:
//
//	R/sys/devices/<pcie_root>/<bridge>/.../<pci>/{numa_node,vendor,device,class}
//	R/sys/devices/.../<pci>/infiniband/<name>/ports/<n>/{state,phys_state,link_layer,rate}
//	R/sys/devices/.../<pci>/infiniband/<name>/device -> ../../../<pci>
//	R/sys/devices/.../<pci>/driver -> ../../../bus/pci/drivers/mlx5_core
//	R/sys/bus/pci/drivers/mlx5_core/<pci> -> ../../../../devices/.../<pci>
//	R/sys/devices/.../<pci>/infiniband/<name>/{fw_ver,node_guid}
//	R/sys/devices/.../<pci>/net/<netdev>/{address,type}
//	R/sys/devices/.../<pci>/infiniband_verbs/uverbsN/{ibdev,dev,device -> ../../../<pci>}
//	R/sys/devices/.../<pci>/infiniband_mad/{umadN,issmN}/{ibdev,port,dev}
//	R/sys/devices/virtual/misc/rdma_cm/dev, R/sys/class/misc/rdma_cm -> ...
//	  (dev: "major:minor": uverbsN 231:192+N, umadN 231:N, issmN 231:64+N, rdma_cm 10:58)
//	R/sys/class/infiniband/<name> -> ../../devices/.../<pci>/infiniband/<name>
//	R/sys/class/infiniband_verbs/uverbsN -> ../../devices/.../infiniband_verbs/uverbsN
//	R/sys/class/infiniband_mad/{umadN,issmN} -> ...
//	R/dev/infiniband/{uverbsN,umadN,issmN,rdma_cm}  (regular files standing in for char devices)
//	R/sys/devices/<pcie_root>/<bridge>/.../<gpu pci>/{numa_node,vendor,device,class}
//	R/sys/bus/pci/devices/<pci> -> ../../../devices/.../<pci>  (every HCA and GPU)
//	R/sys/devices/system/node/node<N>/cpulist  ("" for a NUMA node without CPUs)
//
// uverbs and umad/issm numbers are assigned in PCI-address order, as SysfsFixture::AddTopology
// does with the snapshot's HCAs.
type Sysfs struct {
	Root    string
	hcas    map[string]HCA    // HCA name -> what was laid out
	devDirs map[string]string // HCA name -> .../<pci>
	Uverbs  map[string]int    // HCA name -> N of uverbsN
	Mads    map[string][]int  // HCA name -> N of umadN/issmN per port
}

// WriteSysfs lays out every HCA of the node under root, plus rdma_cm.
func WriteSysfs(root string, n *Node) (*Sysfs, error) {
	s := &Sysfs{Root: root, hcas: map[string]HCA{}, devDirs: map[string]string{},
		Uverbs: map[string]int{}, Mads: map[string][]int{}}
	nextUverbs, nextMad := 0, 0
	for _, h := range n.HCAs {
		if err := s.addHCA(h, &nextUverbs, &nextMad); err != nil {
			return nil, err
		}
	}
	if err := writeKernelPCI(root, n); err != nil {
		return nil, err
	}
	misc := filepath.Join(root, "sys", "devices", "virtual", "misc", "rdma_cm")
	if err := writeFile(filepath.Join(misc, "dev"), RdmaCmDev); err != nil {
		return nil, err
	}
	if err := symlink(misc, filepath.Join(root, "sys", "class", "misc", "rdma_cm")); err != nil {
		return nil, err
	}
	return s, writeFile(filepath.Join(root, "dev", "infiniband", "rdma_cm"), "")
}

// writeKernelPCI lays out what the kernel also shows of the node beside its RDMA devices, as
// sim/sysfs_fixture.cc's AddTopology does: the GPUs' device directories, the /sys/bus/pci/devices
// link of every HCA and GPU (relative, ../../../devices/pci0000:15/.../0000:1a:00.0) and the NUMA
// nodes' cpulists.
func writeKernelPCI(root string, n *Node) error {
	sys := filepath.Join(root, "sys")
	devDir := func(pciRoot string, bridges []string, pci string) string {
		return filepath.Join(append([]string{sys, "devices", pciRoot}, append(bridges, pci)...)...)
	}
	for _, g := range n.GPUs {
		dev := devDir(g.PCIeRoot, g.Bridges, g.PCI)
		for f, c := range map[string]string{"numa_node": strconv.Itoa(g.NUMA), "vendor": "0x" + g.Vendor,
			"device": "0x" + g.Device, "class": "0x" + g.Class + "00"} {
			if err := writeFile(filepath.Join(dev, f), c); err != nil {
				return err
			}
		}
		if err := symlink(dev, filepath.Join(sys, "bus", "pci", "devices", g.PCI)); err != nil {
			return err
		}
	}
	for _, h := range n.HCAs {
		if err := symlink(devDir(h.PCIeRoot, h.Bridges, h.PCI), filepath.Join(sys, "bus", "pci", "devices", h.PCI)); err != nil {
			return err
		}
	}
	for _, m := range n.NUMA {
		cpus := filepath.Join(sys, "devices", "system", "node", fmt.Sprintf("node%d", m.ID), "cpulist")
		if err := writeFile(cpus, m.CPUs); err != nil {
			return err
		}
	}
	return nil
}

// Device numbers the fixture gives the nodes, as the kernel numbers them: ib_uverbs and ib_umad
// share major 231; rdma_cm is a misc device (major 10, minor dynamic).
const (
	IBMajor         = 231
	UverbsMinorBase = 192
	IssmMinorBase   = 64
	RdmaCmDev       = "10:58"
)

func writeFile(path, content string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(content+"\n"), 0o644)
}

// symlink makes a relative link, as sysfs has them.
func symlink(target, link string) error {
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		return err
	}
	rel, err := filepath.Rel(filepath.Dir(link), target)
	if err != nil {
		return err
	}
	_ = os.Remove(link)
	return os.Symlink(rel, link)
}

var portStateNumber = map[string]int{"DOWN": 1, "INIT": 2, "ARMED": 3, "ACTIVE": 4, "ACTIVE_DEFER": 5}

func (s *Sysfs) addHCA(h HCA, nextUverbs, nextMad *int) error {
	sys := filepath.Join(s.Root, "sys")
	devDir := filepath.Join(append([]string{sys, "devices", h.PCIeRoot}, append(h.Bridges, h.PCI)...)...)
	s.hcas[h.Name] = h
	s.devDirs[h.Name] = devDir
	s.Mads[h.Name] = nil
	files := map[string]string{
		"numa_node": strconv.Itoa(h.NUMA), "vendor": "0x" + h.Vendor, "device": "0x" + h.Device,
		"class": "0x020700",
	}
	for f, c := range files {
		if err := writeFile(filepath.Join(devDir, f), c); err != nil {
			return err
		}
	}
	// The driver every HCA of the C++ fixture is bound to (sim/sysfs_fixture.h's defaults).
	driver := filepath.Join(sys, "bus", "pci", "drivers", "mlx5_core")
	if err := symlink(driver, filepath.Join(devDir, "driver")); err != nil {
		return err
	}
	if err := symlink(devDir, filepath.Join(driver, h.PCI)); err != nil {
		return err
	}
	ib := filepath.Join(devDir, "infiniband", h.Name)
	if err := symlink(devDir, filepath.Join(ib, "device")); err != nil {
		return err
	}
	guid := h.NodeGUID
	if guid == "" {
		guid = fixtureNodeGUID(h.PCI)
	}
	if err := writeFile(filepath.Join(ib, "fw_ver"), "28.39.1002"); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(ib, "node_guid"), guid); err != nil {
		return err
	}
	linkLayer := "InfiniBand"
	if h.Ethernet() {
		linkLayer = "Ethernet"
	}
	// The port counters the C++ fixture writes (sim/sysfs_fixture.cc FixtureCounters), from the
	// HCA's uverbs number k (assigned below, in the same order).
	k := uint64(*nextUverbs) + 1
	for _, p := range h.Ports {
		pd := filepath.Join(ib, "ports", strconv.Itoa(p))
		for f, v := range map[string]uint64{
			"port_rcv_data": 1000000*k + uint64(p), "port_xmit_data": 2000000*k + uint64(p),
			"port_rcv_packets": 10000 * k, "port_xmit_packets": 20000 * k,
			"symbol_error": 0, "link_downed": k - 1, "port_rcv_errors": 0,
		} {
			if err := writeFile(filepath.Join(pd, "counters", f), strconv.FormatUint(v, 10)); err != nil {
				return err
			}
		}
		state := h.PortState[p]
		phys := "5: LinkUp"
		if state != "ACTIVE" {
			phys = "2: Polling"
		}
		for f, c := range map[string]string{
			"state":      fmt.Sprintf("%d: %s", portStateNumber[state], state),
			"phys_state": phys, "link_layer": linkLayer, "rate": "400 Gb/sec (4X NDR)",
		} {
			if err := writeFile(filepath.Join(pd, f), c); err != nil {
				return err
			}
		}
	}
	if err := symlink(ib, filepath.Join(sys, "class", "infiniband", h.Name)); err != nil {
		return err
	}
	for i, nd := range h.Netdevs {
		if err := os.MkdirAll(filepath.Join(devDir, "net", nd), 0o755); err != nil {
			return err
		}
		if err := writeFile(filepath.Join(devDir, "net", nd, "address"), netdevAddress(h.PCI, i)); err != nil {
			return err
		}
		linkType := "32" // ARPHRD_INFINIBAND
		if h.Ethernet() {
			linkType = "1" // ARPHRD_ETHER
		}
		if err := writeFile(filepath.Join(devDir, "net", nd, "type"), linkType); err != nil {
			return err
		}
	}
	devIB := filepath.Join(s.Root, "dev", "infiniband")
	n := *nextUverbs
	*nextUverbs++
	s.Uverbs[h.Name] = n
	uverbs := fmt.Sprintf("uverbs%d", n)
	vd := filepath.Join(devDir, "infiniband_verbs", uverbs)
	steps := []func() error{
		func() error { return writeFile(filepath.Join(vd, "ibdev"), h.Name) },
		func() error {
			return writeFile(filepath.Join(vd, "dev"), fmt.Sprintf("%d:%d", IBMajor, UverbsMinorBase+n))
		},
		func() error { return symlink(devDir, filepath.Join(vd, "device")) },
		func() error { return symlink(vd, filepath.Join(sys, "class", "infiniband_verbs", uverbs)) },
		func() error { return writeFile(filepath.Join(sys, "class", "infiniband_verbs", "abi_version"), "6") },
		func() error { return writeFile(filepath.Join(devIB, uverbs), "") },
	}
	if !h.Ethernet() {
		for _, p := range h.Ports {
			m := *nextMad
			*nextMad++
			s.Mads[h.Name] = append(s.Mads[h.Name], m)
			for _, kind := range []string{"umad", "issm"} {
				name := fmt.Sprintf("%s%d", kind, m)
				md := filepath.Join(devDir, "infiniband_mad", name)
				port := p
				minor := m
				if kind == "issm" {
					minor += IssmMinorBase
				}
				steps = append(steps,
					func() error { return writeFile(filepath.Join(md, "ibdev"), h.Name) },
					func() error { return writeFile(filepath.Join(md, "port"), strconv.Itoa(port)) },
					func() error { return writeFile(filepath.Join(md, "dev"), fmt.Sprintf("%d:%d", IBMajor, minor)) },
					func() error { return symlink(md, filepath.Join(sys, "class", "infiniband_mad", name)) },
					func() error { return writeFile(filepath.Join(devIB, name), "") })
			}
		}
		steps = append(steps, func() error {
			return writeFile(filepath.Join(sys, "class", "infiniband_mad", "abi_version"), "5")
		})
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

// SetPortState rewrites a port's state file through a rename, so the plugin never reads a
// half-written file.
func (s *Sysfs) SetPortState(name string, port int, state string) error {
	dir, ok := s.devDirs[name]
	if !ok {
		return fmt.Errorf("no HCA %s", name)
	}
	file := filepath.Join(dir, "infiniband", name, "ports", strconv.Itoa(port), "state")
	tmp := file + ".tmp"
	if err := writeFile(tmp, fmt.Sprintf("%d: %s", portStateNumber[state], state)); err != nil {
		return err
	}
	return os.Rename(tmp, file)
}

// RemoveHCA takes an HCA away as a hot-unplug does: class links first (as the kernel's
// device_del), then its /dev nodes and its device directory.
func (s *Sysfs) RemoveHCA(name string) error {
	dir, ok := s.devDirs[name]
	if !ok {
		return fmt.Errorf("no HCA %s", name)
	}
	sys := filepath.Join(s.Root, "sys")
	devIB := filepath.Join(s.Root, "dev", "infiniband")
	paths := []string{
		filepath.Join(sys, "class", "infiniband", name),
		filepath.Join(sys, "class", "infiniband_verbs", fmt.Sprintf("uverbs%d", s.Uverbs[name])),
		filepath.Join(devIB, fmt.Sprintf("uverbs%d", s.Uverbs[name])),
	}
	for _, m := range s.Mads[name] {
		for _, kind := range []string{"umad", "issm"} {
			paths = append(paths, filepath.Join(sys, "class", "infiniband_mad", fmt.Sprintf("%s%d", kind, m)),
				filepath.Join(devIB, fmt.Sprintf("%s%d", kind, m)))
		}
	}
	paths = append(paths, filepath.Join(sys, "bus", "pci", "drivers", "mlx5_core", s.hcas[name].PCI))
	for _, p := range append(paths, dir) {
		if err := os.RemoveAll(p); err != nil {
			return err
		}
	}
	return nil
}

// RestoreHCA lays a removed HCA out again with its old uverbs/umad numbers.
func (s *Sysfs) RestoreHCA(name string) error {
	h, ok := s.hcas[name]
	if !ok {
		return fmt.Errorf("no HCA %s", name)
	}
	nextUverbs, nextMad := s.Uverbs[name], 0
	if m := s.Mads[name]; len(m) > 0 {
		nextMad = m[0]
	}
	return s.addHCA(h, &nextUverbs, &nextMad)
}

// DeviceFiles returns the /dev/infiniband paths (as the container sees them) an HCA owns.
func (s *Sysfs) DeviceFiles(name string) []string {
	out := []string{fmt.Sprintf("/dev/infiniband/uverbs%d", s.Uverbs[name])}
	for _, m := range s.Mads[name] {
		out = append(out, fmt.Sprintf("/dev/infiniband/umad%d", m), fmt.Sprintf("/dev/infiniband/issm%d", m))
	}
	return out
}

// BinaryWritesFixtures reports whether the plugin binary has the hidden `fixture` subcommand.
func BinaryWritesFixtures(binary string) bool {
	out, _ := exec.Command(binary, "fixture", "--help").CombinedOutput()
	return strings.Contains(string(out), "--out")
}

// WriteSysfsWithBinary asks the plugin binary to lay out the fixture (the C++
// SysfsFixture::AddTopology), and returns a Sysfs that can still flip port states.
func WriteSysfsWithBinary(binary, root string, n *Node) (*Sysfs, error) {
	out, err := exec.Command(binary, "fixture", "--topology-xml", n.XML, "--out", root,
		"--log-level", "warn").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("%s fixture: %v: %s", binary, err, out)
	}
	return binarySysfs(root, n)
}

// WriteNamedNodeWithBinary asks the plugin binary to lay out one of its named nodes
// (`fixture --node NAME`, sim/fixture_node.h) under root, and returns the node as its XML
// (written to root/NAME.xml) holds it and a Sysfs over the layout. A named node may hold more
// than its XML: dgx-roles' SR-IOV VFs are in the layout alone, so they are in neither Node.HCAs
// nor the Sysfs.
func WriteNamedNodeWithBinary(binary, name, root string) (*Node, *Sysfs, error) {
	out, err := exec.Command(binary, "fixture", "--node", name, "--out", root,
		"--log-level", "warn").CombinedOutput()
	if err != nil {
		return nil, nil, fmt.Errorf("%s fixture --node %s: %v: %s", binary, name, err, out)
	}
	n, err := LoadNode(filepath.Join(root, name+".xml"))
	if err != nil {
		return nil, nil, err
	}
	s, err := binarySysfs(root, n)
	return n, s, err
}

// binarySysfs is the Sysfs over a layout the binary wrote under root for the HCAs of n.
func binarySysfs(root string, n *Node) (*Sysfs, error) {
	s := &Sysfs{Root: root, hcas: map[string]HCA{}, devDirs: map[string]string{},
		Uverbs: map[string]int{}, Mads: map[string][]int{}}
	for _, h := range n.HCAs {
		s.hcas[h.Name] = h
		link := filepath.Join(root, "sys", "class", "infiniband", h.Name)
		real, err := filepath.EvalSymlinks(link)
		if err != nil {
			return nil, fmt.Errorf("binary fixture lacks %s: %w", link, err)
		}
		s.devDirs[h.Name] = filepath.Dir(filepath.Dir(real))
		verbs, _ := filepath.Glob(filepath.Join(s.devDirs[h.Name], "infiniband_verbs", "uverbs*"))
		for _, v := range verbs {
			n, _ := strconv.Atoi(strings.TrimPrefix(filepath.Base(v), "uverbs"))
			s.Uverbs[h.Name] = n
		}
		mads, _ := filepath.Glob(filepath.Join(s.devDirs[h.Name], "infiniband_mad", "umad*"))
		for _, m := range mads {
			n, _ := strconv.Atoi(strings.TrimPrefix(filepath.Base(m), "umad"))
			s.Mads[h.Name] = append(s.Mads[h.Name], n)
		}
		sort.Ints(s.Mads[h.Name])
	}
	return s, nil
}

// DRADeviceName is the name of an HCA in our ResourceSlices: "hca-" and its PCI address with
// ':' and '.' as '-' (dra/devices.h).
func DRADeviceName(h HCA) string {
	return "hca-" + strings.NewReplacer(":", "-", ".", "-").Replace(h.PCI)
}

// Minus is a without the strings in b, in a's order (what one list has that another lacks, for a
// test's message or its check).
func Minus(a, b []string) []string {
	drop := map[string]bool{}
	for _, x := range b {
		drop[x] = true
	}
	var out []string
	for _, x := range a {
		if !drop[x] {
			out = append(out, x)
		}
	}
	return out
}

// netdevAddress: the hardware address the binary's fixture gives netdev `index` of the PCI
// function `pci` (sim/sysfs_fixture.cc NetdevAddress): "0000:1a:00.0", 0 -> "02:00:00:1a:00:00",
// a locally administered address.
// fixtureNodeGUID is sim::FixtureNodeGuid: "0000:1a:00.1" -> "b8ce:f600:001a:0001".
func fixtureNodeGUID(pci string) string {
	var domain, bus, device, function int
	if _, err := fmt.Sscanf(pci, "%x:%x:%x.%x", &domain, &bus, &device, &function); err != nil {
		return ""
	}
	return fmt.Sprintf("b8ce:f6%02x:%04x:%04x", domain&0xff, bus&0xffff, (device&0xff)<<8|function&0xff)
}

func netdevAddress(pci string, index int) string {
	var domain, bus, device, function uint
	if n, _ := fmt.Sscanf(pci, "%x:%x:%x.%x", &domain, &bus, &device, &function); n != 4 {
		return ""
	}
	return fmt.Sprintf("02:%02x:%02x:%02x:%02x:%02x", domain&0xff, bus&0xff, device&0xff, function&0xff, index&0xff)
}

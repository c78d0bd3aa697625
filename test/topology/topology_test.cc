// Path classes and PCI addresses on hand-built placements.

#include "topology/topology.h"

#include <random>

#include "gtest/gtest.h"

namespace rdp::topology {
namespace {

// A placement under root "pci0000:<root>" through the given bridges. Each bridge is written
// "bdf" (root port or plain bridge) or "bdf@switch" (a port of that switch).
PciPlacement Place(const std::string& pci, int numa, const std::string& root,
                   std::vector<std::string> bridges) {
  PciPlacement p;
  p.pci = pci;
  p.numa = numa;
  p.pcie_root = root;
  p.bridges_known = true;
  for (const std::string& b : bridges) {
    auto at = b.find('@');
    p.bridges.push_back(at == std::string::npos ? Bridge{b, ""}
                                                : Bridge{b.substr(0, at), b.substr(at + 1)});
  }
  return p;
}

struct ClassifyCase {
  const char* name;
  PciPlacement a, b;
  PathClass want;
};

TEST(ClassifyTest, Table) {
  const std::string kUp = "0000:16:00.0";
  std::vector<ClassifyCase> cases = {
      {"same switch",
       Place("0000:18:00.0", 0, "pci0000:15", {"0000:15:01.0", kUp + "@" + kUp, "0000:17:00.0@" + kUp}),
       Place("0000:1a:00.0", 0, "pci0000:15", {"0000:15:01.0", kUp + "@" + kUp, "0000:17:02.0@" + kUp}),
       PathClass::kPIX},
      {"two-level: inner switch vs outer switch's other port",
       Place("0000:34:00.0", 0, "pci0000:2b",
             {"0000:2b:00.0", "0000:2c:00.0@A", "0000:2d:04.0@A", "0000:32:00.0@B", "0000:33:00.0@B"}),
       Place("0000:35:00.0", 0, "pci0000:2b", {"0000:2b:00.0", "0000:2c:00.0@A", "0000:2d:08.0@A"}),
       PathClass::kPXB},
      {"two-level: both under the inner switch",
       Place("0000:34:00.0", 0, "pci0000:2b",
             {"0000:2b:00.0", "0000:2c:00.0@A", "0000:2d:04.0@A", "0000:32:00.0@B", "0000:33:00.0@B"}),
       Place("0000:36:00.0", 0, "pci0000:2b",
             {"0000:2b:00.0", "0000:2c:00.0@A", "0000:2d:04.0@A", "0000:32:00.0@B", "0000:33:10.0@B"}),
       PathClass::kPIX},
      {"two functions behind one root port",
       Place("0000:84:00.0", 1, "pci0000:80", {"0000:80:03.0"}),
       Place("0000:84:00.1", 1, "pci0000:80", {"0000:80:03.0"}), PathClass::kPIX},
      {"different root ports of one host bridge",
       Place("0000:03:00.0", 0, "pci0000:00", {"0000:00:03.0"}),
       Place("0000:04:00.0", 0, "pci0000:00", {"0000:00:11.0"}), PathClass::kPHB},
      {"device directly on the root bus", Place("0000:00:1f.2", 0, "pci0000:00", {}),
       Place("0000:04:00.0", 0, "pci0000:00", {"0000:00:11.0"}), PathClass::kPHB},
      {"host bridges of one NUMA node", Place("0000:18:00.0", 0, "pci0000:15", {"0000:15:01.0"}),
       Place("0000:3a:00.0", 0, "pci0000:37", {"0000:37:01.0"}), PathClass::kNODE},
      {"across NUMA nodes", Place("0000:18:00.0", 0, "pci0000:15", {"0000:15:01.0"}),
       Place("0000:9d:00.0", 1, "pci0000:9a", {"0000:9a:01.0"}), PathClass::kSYS},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(Classify(c.a, c.b), c.want) << c.name;
    EXPECT_EQ(Classify(c.b, c.a), c.want) << c.name << " (reversed)";
  }
}

TEST(ClassifyTest, UnknownLocality) {
  PciPlacement a = Place("0000:18:00.0", 0, "pci0000:15", {"0000:15:01.0"});
  PciPlacement b = Place("0000:3a:00.0", 0, "pci0000:37", {"0000:37:01.0"});
  b.numa.reset();
  EXPECT_EQ(Classify(a, b), PathClass::kSYS) << "different roots, NUMA unknown";
  PciPlacement c = Place("0000:19:00.0", 0, "pci0000:15", {});
  c.bridges_known = false;  // sysfs knows the root but hwloc lacks the device
  EXPECT_EQ(Classify(a, c), PathClass::kPHB);
  c.pcie_root.clear();
  EXPECT_EQ(Classify(a, c), PathClass::kNODE) << "same NUMA, root unknown";
}

TEST(PlacementTest, SwitchIsInnermost) {
  PciPlacement p = Place("0000:34:00.0", 0, "pci0000:2b",
                         {"0000:2b:00.0", "0000:2c:00.0@A", "0000:2d:04.0@A", "0000:32:00.0@B",
                          "0000:33:00.0@B"});
  EXPECT_EQ(p.Switch(), "B");
  EXPECT_EQ(Place("0000:03:00.0", 0, "pci0000:00", {"0000:00:03.0"}).Switch(), "");
}

TEST(NormalizePciTest, Forms) {
  EXPECT_EQ(NormalizePci("0000:1A:00.0"), "0000:1a:00.0");
  EXPECT_EQ(NormalizePci("1a:00.1"), "0000:1a:00.1");
  EXPECT_EQ(NormalizePci("0001:08:1f.7"), "0001:08:1f.7");
  for (const char* bad : {"", "mlx5_0", "0000:1a:00", "0000:1a:20.0", "0000:1a:00.8",
                          "0000:1a:00.0x", "-1:00:00.0", "0x0000:1a:00.0", "10000:00:00.0"}) {
    EXPECT_EQ(NormalizePci(bad), std::nullopt) << bad;
  }
}

// NormalizePci answers a canonical address without parsing it; that shortcut must take exactly
// the strings the parser gives back unchanged. A canonical-looking string is checked against the
// parser through another spelling of it (a letter in upper case, or the domain dropped), which
// the shortcut does not take. Every position is drawn from hex digits of both cases, separators
// and junk.
TEST(NormalizePciTest, TheShortcutTakesExactlyWhatTheParserWouldGiveBack) {
  std::mt19937 rng(7);
  const std::string alphabet = "0123456789abcdefABCDEFgG:.x-+ ";
  int compared = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string s = "0000:00:00.0";
    for (size_t at = 0; at < s.size(); ++at) {
      const bool separator = s[at] == ':' || s[at] == '.';
      if (rng() % 8 != 0) {  // mostly shaped like an address, device and function near range
        if (!separator) {
          s[at] = at == 8 ? "0123"[rng() % 4] : at == 11 ? "0123456789"[rng() % 10]
                                                         : alphabet[rng() % 16];
        }
        continue;
      }
      s[at] = alphabet[rng() % alphabet.size()];
    }
    if (rng() % 16 == 0) s.erase(rng() % s.size(), 1);
    // A spelling of the same address that only the parser reads.
    std::string other;
    if (auto letter = s.find_first_of("abcdef"); letter != std::string::npos) {
      other = s;
      other[letter] = static_cast<char>(other[letter] - 'a' + 'A');
    } else if (s.size() == 12 && s.compare(0, 5, "0000:") == 0) {
      other = s.substr(5);
    }
    const bool canonical = IsCanonicalPci(s);
    EXPECT_EQ(canonical, NormalizePci(s) == s) << "'" << s << "'";
    if (!other.empty() && canonical) {
      ++compared;
      EXPECT_EQ(NormalizePci(other), s) << "'" << s << "' spelled '" << other << "'";
    }
    if (!other.empty() && NormalizePci(other) == s) {
      EXPECT_TRUE(canonical) << "'" << s << "'";
    }
  }
  EXPECT_GT(compared, 1000);
}

TEST(TopologyTest, SortsIndexesAndPrecomputesPaths) {
  Hca h1{"mlx5_1", Place("0000:1b:00.0", 0, "pci0000:15", {"0000:15:01.0"}), "uverbs1"};
  Hca h0{"mlx5_0", Place("0000:1a:00.0", 1, "pci0000:9a", {"0000:9a:01.0"}), "uverbs0"};
  Gpu g{Place("0000:18:00.0", 0, "pci0000:15", {"0000:15:01.0"}), "10de", "2330"};
  Topology t({1, 0, 1}, {h1, h0}, {g});
  EXPECT_EQ(t.numa_nodes(), (std::vector<int>{0, 1}));
  ASSERT_EQ(t.hcas().size(), 2u);
  EXPECT_EQ(t.hcas()[0].name, "mlx5_0");
  EXPECT_EQ(t.HcaIndex("0000:1B:00.0"), 1);
  EXPECT_EQ(t.HcaIndex("0000:1c:00.0"), -1);
  EXPECT_EQ(t.HcaIndex("junk"), -1);
  EXPECT_EQ(t.GpuIndex("18:00.0"), 0);
  EXPECT_EQ(t.Path(0, 0), PathClass::kSYS);
  EXPECT_EQ(t.Path(1, 0), PathClass::kPIX);
}

TEST(HcaTest, Health) {
  Hca h;
  EXPECT_FALSE(h.AllPortsActive()) << "no ports known";
  h.ports = {{1, "ACTIVE"}, {2, "DOWN"}};
  EXPECT_FALSE(h.AllPortsActive());
  h.ports[1].state = "ACTIVE";
  EXPECT_TRUE(h.AllPortsActive());
}

}  // namespace
}  // namespace rdp::topology

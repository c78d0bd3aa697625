# quality_sim: replays pod streams through a model of the kubelet's device manager and Topology
# Manager and compares HCA policies. Included by bench/CMakeLists.txt.
add_executable(quality_sim ${CMAKE_CURRENT_LIST_DIR}/quality_sim.cc)
target_link_libraries(quality_sim PRIVATE rdp_allocator rdp_test_support rdp_topology
  CLI11::CLI11)
target_compile_definitions(quality_sim PRIVATE
  RDP_DEFAULT_TOPOLOGY_XML="${CMAKE_CURRENT_LIST_DIR}/../test/data/dgx-h100-like.xml")

# quality_sim: how often the allocator's bounded search finds the exhaustive optimum
# (docs/allocator.md). Included by bench/CMakeLists.txt.
add_executable(quality_sim ${CMAKE_CURRENT_LIST_DIR}/quality_sim.cc)
target_link_libraries(quality_sim PRIVATE rdp_allocator rdp_test_support rdp_topology
  CLI11::CLI11)

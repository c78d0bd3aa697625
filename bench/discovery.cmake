# Discovery per fixture beside hwloc's own load of the same input (the floor).
add_executable(bench_discovery ${CMAKE_CURRENT_LIST_DIR}/discovery_bench.cc)
target_link_libraries(bench_discovery PRIVATE rdp_sim_fixture PkgConfig::HWLOC benchmark::benchmark)
target_compile_definitions(bench_discovery PRIVATE RDP_TEST_DATA="${PROJECT_SOURCE_DIR}/test/data")

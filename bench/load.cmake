# bench_load: the rdma-device-plugin binary under concurrent GetPreferredAllocation + Allocate
# over its unix socket, beside an empty-RPC floor; latency percentiles, errors, plugin RSS.
# Included by bench/CMakeLists.txt. See docs/reliability.md (Load) for the command and figures.
if(TARGET rdp_deviceplugin)
  add_executable(bench_load ${CMAKE_CURRENT_LIST_DIR}/load.cc)
  # kube/'s HTTP transport: --scrape's /metrics scraper.
  target_link_libraries(bench_load PRIVATE rdp_sim rdp_test_support rdp_kube absl::str_format
    CLI11::CLI11 nlohmann_json::nlohmann_json)
  # The plugin it spawns: the binary of this build unless --binary says otherwise.
  add_dependencies(bench_load rdma-device-plugin)

  if(BUILD_TESTING)
    # Smoke run: 8 clients for a few seconds must see zero errors and a clean plugin stop (the
    # exit code). Nothing about timing is checked.
    add_test(NAME BenchLoadSmoke
      COMMAND bench_load --clients 8 --duration 2s --floor-duration 1s --warmup 500ms)
    set_tests_properties(BenchLoadSmoke PROPERTIES TIMEOUT 120 LABELS slow)
  endif()
endif()

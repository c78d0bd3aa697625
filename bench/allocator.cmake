# bench_allocator: allocator compute time and answer quality beside a go-gpuallocator-style
# peer baseline. Included by bench/CMakeLists.txt; paths relative to this file.
add_executable(bench_allocator
  ${CMAKE_CURRENT_LIST_DIR}/allocator_bench.cc
  ${CMAKE_CURRENT_LIST_DIR}/allocator_peer.cc)
target_link_libraries(bench_allocator PRIVATE rdp_allocator rdp_test_support
  benchmark::benchmark)

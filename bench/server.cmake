# bench_rpc: GetPreferredAllocation and Allocate round trips over a unix socket, beside the
# empty RPC (GetDevicePluginOptions) on the same server as the floor; RSS after 1e5 calls.
# See docs/server.md for the command and figures.
add_executable(bench_rpc ${CMAKE_CURRENT_LIST_DIR}/rpc_bench.cc)
target_link_libraries(bench_rpc PRIVATE rdp_sim benchmark::benchmark)

# bench_rpc: GetPreferredAllocation and Allocate round trips over a unix socket, beside two floors
# on the same server: the empty RPC (GetDevicePluginOptions) and a no-op RPC carrying the same
# request and response bytes (bench/payload_floor.proto, served by the bench alone); RSS after
# 1e5 calls. See docs/benchmarks.md for the command and figures.
set(RDP_GRPC_SRCS)
rdp_grpc_generate(${CMAKE_CURRENT_BINARY_DIR}/gen bench/payload_floor)
add_library(rdp_bench_proto STATIC ${RDP_GRPC_SRCS})
target_include_directories(rdp_bench_proto PUBLIC ${CMAKE_CURRENT_BINARY_DIR}/gen)
target_link_libraries(rdp_bench_proto PUBLIC rdp_proto)
target_compile_options(rdp_bench_proto PRIVATE -w)

add_executable(bench_rpc ${CMAKE_CURRENT_LIST_DIR}/rpc_bench.cc)
target_link_libraries(bench_rpc PRIVATE rdp_sim rdp_bench_proto benchmark::benchmark)

#!/usr/bin/env bash
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 GIN4J_REQUIRE_KERNELS=1
b=dist/gin4j-bundle
cp_="$b/lib/gin4j.jar:$b/lib/gin4j-bindings.jar:$b/lib/gin4j-tests.jar:$b/lib/gin4j-bindings-tests.jar"
GIN4J_NCCL_LIBRARY=/tmp/gin4j-nccl/lib/libnccl.so.2.29.7 NCCL_GIN_PLUGIN="$PWD/$b/lib/libnccl-gin-loopback.so" \
timeout "$1" "$b/runtime/bin/java" -Xmx32g --enable-native-access=ALL-UNNAMED -jar "$b/lib/junit-platform-console-standalone.jar" execute -cp "$cp_" \
  --select-method dev.gin4j.comm.LoopbackGinGpuTest#twoRanksMoeAcrossNodes --include-tag gpu --details=tree --disable-banner > "$OUT/gin-moe2.log" 2>&1
echo "rc=$?"; grep -E "tests (successful|failed)" "$OUT/gin-moe2.log"

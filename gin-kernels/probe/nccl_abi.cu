// nccl_abi.cu: prints, as Java properties, the NCCL device-API ABI of the headers it is compiled
// against (sizes, field offsets, the requirements initializer). gin-kernels/build runs it and merges
// the output into manifest.properties, so the Java side fills ncclDevCommRequirements and checks
// ncclDevComm for exactly the NCCL that the code objects were built for.
//
// NCCL gives no ABI stability between releases: 2.28.3's ncclDevCommRequirements is a bare list
// of settings, 2.29 prepends a size/magic/version header and adds GIN and barrier fields. Rather
// than one #if branch per release, every field name known from any release is detected at
// compile time, and bytes of the struct that no known field covers are reported (and fail the
// probe), so a release with a new field cannot slip through as a silently wrong layout.
// Host-only program; needs no GPU and no libnccl.
#include <nccl.h>
#include <nccl_device.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <type_traits>
#include <vector>

#ifndef NCCL_VERSION_CODE
#error "nccl.h defines no NCCL_VERSION_CODE"
#endif

struct Field {
  const char* name;
  size_t offset;
  size_t size;
};

// For field F: has_F<T> is true when T has a data member F; collect_F appends its offset and size.
#define GIN_PROBE_FIELD(F)                                                                  \
  template <typename T, typename = void> struct has_##F : std::false_type {};              \
  template <typename T> struct has_##F<T, std::void_t<decltype(&T::F)>> : std::true_type {}; \
  template <typename T> void collect_##F(std::vector<Field>& out) {                        \
    if constexpr (has_##F<T>::value) {                                                     \
      Field field;                                                                          \
      field.name = #F;                                                                      \
      field.offset = offsetof(T, F);                                                        \
      field.size = sizeof(static_cast<T*>(nullptr)->F);                                     \
      out.push_back(field);                                                                 \
    }                                                                                       \
  }

// Every ncclDevCommRequirements field seen in 2.28.x, 2.29.x and 2.30.x headers.
#define GIN_REQUIREMENT_FIELDS(X) \
  X(size) X(magic) X(version) X(resourceRequirementsList) X(teamRequirementsList)          \
  X(lsaMultimem) X(multimem) X(barrierCount) X(lsaBarrierCount) X(outLsaBarrierHandle)      \
  X(railGinBarrierCount) X(worldGinBarrierCount) X(lsaLLA2ABlockCount) X(lsaLLA2ASlotCount) \
  X(outLsaLLA2AHandle) X(ginForceEnable) X(ginContextCount) X(ginSignalCount)               \
  X(ginCounterCount) X(ginConnectionType) X(ginExclusiveContexts) X(ginQueueDepth)          \
  X(ginTrafficClass) X(ginStrongSignalsRequired) X(ginVaSignalsRequired)

// ncclDevComm fields the Java side reads or sets after ncclDevCommCreate (abortFlag: NCCL leaves it
// null in a user's device communicator, so gin4j points it at its own word; see DeviceComm).
#define GIN_DEVCOMM_FIELDS(X) X(rank) X(nRanks) X(lsaRank) X(lsaSize) X(abortFlag)

// ncclCommProperties (2.29+, ncclCommQueryProperties).
#define GIN_PROPERTIES_FIELDS(X) \
  X(rank) X(nRanks) X(cudaDev) X(nvmlDev) X(deviceApiSupport) X(multimemSupport) X(ginType) \
  X(nLsaTeams) X(hostRmaSupport) X(railedGinType)

// Field names may repeat across the lists: define each detector once.
GIN_REQUIREMENT_FIELDS(GIN_PROBE_FIELD)
GIN_PROBE_FIELD(rank)
GIN_PROBE_FIELD(nRanks)
GIN_PROBE_FIELD(lsaRank)
GIN_PROBE_FIELD(lsaSize)
GIN_PROBE_FIELD(abortFlag)
GIN_PROBE_FIELD(cudaDev)
GIN_PROBE_FIELD(nvmlDev)
GIN_PROBE_FIELD(deviceApiSupport)
GIN_PROBE_FIELD(multimemSupport)
GIN_PROBE_FIELD(ginType)
GIN_PROBE_FIELD(nLsaTeams)
GIN_PROBE_FIELD(hostRmaSupport)
GIN_PROBE_FIELD(railedGinType)

#define GIN_COLLECT(F) collect_##F<T>(fields);

template <typename T> std::vector<Field> requirementFields() {
  std::vector<Field> fields;
  GIN_REQUIREMENT_FIELDS(GIN_COLLECT)
  std::sort(fields.begin(), fields.end(), [](const Field& a, const Field& b) { return a.offset < b.offset; });
  return fields;
}
template <typename T> std::vector<Field> devCommFields() {
  std::vector<Field> fields;
  GIN_DEVCOMM_FIELDS(GIN_COLLECT)
  return fields;
}
template <typename T> std::vector<Field> propertiesFields() {
  std::vector<Field> fields;
  collect_size<T>(fields); collect_magic<T>(fields); collect_version<T>(fields);
  GIN_PROPERTIES_FIELDS(GIN_COLLECT)
  std::sort(fields.begin(), fields.end(), [](const Field& a, const Field& b) { return a.offset < b.offset; });
  return fields;
}

// Returns the number of bytes of a struct of `size` bytes not explained by `fields` plus the
// padding each field's alignment (its size, at most 8: scalars, enums and pointers only) and the
// struct's own alignment may need; prints where they are on stderr.
static size_t uncoveredBytes(const char* structName, const std::vector<Field>& fields, size_t size,
                             size_t structAlign) {
  size_t end = 0, unexplained = 0;
  for (size_t i = 0; i <= fields.size(); i++) {
    size_t next = i < fields.size() ? fields[i].offset : size;
    size_t align = i < fields.size() ? std::min<size_t>(fields[i].size, 8) : structAlign;
    if (i < fields.size() && next < end) {
      fprintf(stderr, "nccl_abi: %s: field %s at %zu overlaps the previous field ending at %zu\n",
              structName, fields[i].name, next, end);
      return size;
    }
    size_t padded = align > 1 ? (end + align - 1) / align * align : end;
    if (next > padded) {
      fprintf(stderr, "nccl_abi: %s: bytes %zu..%zu are not covered by any known field "
                      "(a field this probe does not know; add it to GIN_REQUIREMENT_FIELDS)\n",
              structName, end, next - 1);
      unexplained += next - end;
    }
    if (i < fields.size()) end = fields[i].offset + fields[i].size;
  }
  return unexplained;
}

static void printFields(const char* prefix, const std::vector<Field>& fields) {
  printf("%s.fields=", prefix);
  for (size_t i = 0; i < fields.size(); i++) printf("%s%s", i ? "," : "", fields[i].name);
  printf("\n");
  for (const Field& f : fields) {
    printf("%s.%s.offset=%zu\n", prefix, f.name, f.offset);
    printf("%s.%s.size=%zu\n", prefix, f.name, f.size);
  }
}

// Hex of the struct's known fields as the initializer sets them; padding bytes are zero (the
// bytes of padding after aggregate initialization are unspecified, so they are not copied).
template <typename T> static void printInitializerHex(const char* key, const T& value, const std::vector<Field>& fields) {
  unsigned char bytes[sizeof(T)];
  memset(bytes, 0, sizeof bytes);
  for (const Field& f : fields) memcpy(bytes + f.offset, reinterpret_cast<const unsigned char*>(&value) + f.offset, f.size);
  printf("%s=", key);
  for (size_t i = 0; i < sizeof bytes; i++) printf("%02x", bytes[i]);
  printf("\n");
}

int main() {
  int failures = 0;
  printf("nccl.version=%d\n", (int)NCCL_VERSION_CODE);
#if defined(NCCL_API_MAGIC)
  printf("nccl.apiMagic=0x%08x\n", (unsigned)NCCL_API_MAGIC);
#endif

  // GIN: declared when the device headers ship the ncclGin API and the requirements can ask for
  // GIN signals; whether the loaded library can use it is a run-time question (no RDMA, no GIN).
#if __has_include(<nccl_device/gin.h>)
  const bool ginHeader = true;
#else
  const bool ginHeader = false;
#endif
  printf("nccl.gin=%s\n", ginHeader && has_ginSignalCount<ncclDevCommRequirements>::value ? "true" : "false");

  printf("nccl.devComm.size=%zu\n", sizeof(ncclDevComm));
  printf("nccl.devComm.align=%zu\n", alignof(ncclDevComm));
  {
    std::vector<Field> fields = devCommFields<ncclDevComm>();
    for (const Field& f : fields) {
      printf("nccl.devComm.%s.offset=%zu\n", f.name, f.offset);
      printf("nccl.devComm.%s.size=%zu\n", f.name, f.size);
    }
  }

  std::vector<Field> reqFields = requirementFields<ncclDevCommRequirements>();
  printf("nccl.devCommRequirements.size=%zu\n", sizeof(ncclDevCommRequirements));
  printf("nccl.devCommRequirements.align=%zu\n", alignof(ncclDevCommRequirements));
  printFields("nccl.devCommRequirements", reqFields);
  if (uncoveredBytes("ncclDevCommRequirements", reqFields, sizeof(ncclDevCommRequirements),
                     alignof(ncclDevCommRequirements)) != 0) failures++;
#if defined(NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER)
  {
    const ncclDevCommRequirements initialized = NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER;
    printf("nccl.devCommRequirements.initializer=true\n");
    printInitializerHex("nccl.devCommRequirements.init", initialized, reqFields);
  }
#else
  {
    // No initializer macro in this release: the documented way is to zero the struct.
    ncclDevCommRequirements zeroed;
    memset(&zeroed, 0, sizeof zeroed);
    printf("nccl.devCommRequirements.initializer=false\n");
    printInitializerHex("nccl.devCommRequirements.init", zeroed, reqFields);
  }
#endif

#if defined(NCCL_COMM_PROPERTIES_INITIALIZER)
  {
    std::vector<Field> propFields = propertiesFields<ncclCommProperties>();
    printf("nccl.commProperties.size=%zu\n", sizeof(ncclCommProperties));
    printFields("nccl.commProperties", propFields);
    if (uncoveredBytes("ncclCommProperties", propFields, sizeof(ncclCommProperties),
                       alignof(ncclCommProperties)) != 0) failures++;
    const ncclCommProperties initialized = NCCL_COMM_PROPERTIES_INITIALIZER;
    printInitializerHex("nccl.commProperties.init", initialized, propFields);
  }
#endif
  if (failures != 0) {
    fprintf(stderr, "nccl_abi: the headers hold structure layouts this probe cannot fully describe; "
                    "the manifest would be wrong, so the probe fails\n");
    return 1;
  }
  return 0;
}

// The part of NVIDIA's CUPTI API that kernel busy time (cupti.h) uses, declared here
// so that building hooktrace needs no CUDA toolkit (issue #49). libcupti itself is
// loaded at run time (dlopen) from the CUDA torch wheel's own NVIDIA package; the
// functions are looked up by name (dlsym) into CuptiApi.
//
// Only ABI facts are declared: the callback and record layouts below are copied from
// CUPTI 12.9's cupti_callbacks.h / cupti_activity.h (CUPTI_API_VERSION 28) and
// checked against them (the offsets in static_asserts were printed by a program
// compiled against those headers). Records are read by field offset from the
// record's start; the fields used have kept their offsets since CUpti_ActivityKernel5
// (CUDA 11.0) and CUpti_ActivityMemcpy5 / Memset4, new fields being appended.
#pragma once

#include <cstddef>
#include <cstdint>

namespace hooktrace {
namespace cupti {

using Result = int;  // CUptiResult
constexpr Result kSuccess = 0;
constexpr Result kErrorMaxLimitReached = 12;
constexpr Result kErrorMultipleSubscribers = 39;

using Subscriber = void*;  // CUpti_SubscriberHandle
enum Domain : uint32_t { kDomainDriver = 1, kDomainRuntime = 2, kDomainResource = 3 };
enum Site : uint32_t { kApiEnter = 0, kApiExit = 1 };

// Callback ids (cupti_runtime_cbid.h, cupti_driver_cbid.h, CUpti_CallbackIdResource).
constexpr uint32_t kRuntimeLaunches[] = {
    31,   // cudaMemcpy_v3020
    41,   // cudaMemcpyAsync_v3020
    51,   // cudaMemsetAsync_v3020
    211,  // cudaLaunchKernel_v7000
    214,  // cudaLaunchKernel_ptsz_v7000
    269,  // cudaLaunchCooperativeKernel_v9000
    311,  // cudaGraphLaunch_v10000
    312,  // cudaGraphLaunch_ptsz_v10000
    430,  // cudaLaunchKernelExC_v11060
    431,  // cudaLaunchKernelExC_ptsz_v11060
};
constexpr uint32_t kDriverLaunches[] = {
    216, 220,            // cuMemsetD8Async, cuMemsetD32Async
    277, 279, 281,       // cuMemcpyHtoDAsync_v2, cuMemcpyDtoHAsync_v2, cuMemcpyDtoDAsync_v2
    306, 307,            // cuMemcpyAsync, cuLaunchKernel
    418, 421, 422, 423,  // the _ptsz variants of the four copies
    428, 430,            // cuMemsetD8Async_ptsz, cuMemsetD32Async_ptsz
    442,                 // cuLaunchKernel_ptsz
    477, 478,            // cuLaunchCooperativeKernel(_ptsz)
    514, 515,            // cuGraphLaunch(_ptsz)
    652, 653,            // cuLaunchKernelEx(_ptsz)
};
constexpr uint32_t kResourceGraphNodeCreated = 13;
constexpr uint32_t kResourceGraphNodeCloned = 20;

// CUpti_CallbackData (the API domains): the fields read.
constexpr size_t kCallbackSiteOffset = 0;           // uint32 CUpti_ApiCallbackSite
constexpr size_t kCallbackCorrelationOffset = 64;   // uint32 correlationId
// CUpti_ResourceData: resourceDescriptor (void*) at 16 points to a CUpti_GraphData,
// whose node (CUgraphNode) is at 16 and originalNode at 24.
constexpr size_t kResourceDescriptorOffset = 16;
constexpr size_t kGraphNodeOffset = 16;
constexpr size_t kGraphOriginalNodeOffset = 24;

// Activity kinds and the record fields read (CUpti_ActivityKernel9 / Memcpy6 / Memset4).
enum ActivityKind : uint32_t {
  kActivityMemcpy = 1,
  kActivityMemset = 2,
  kActivityKernel = 3,
  kActivityConcurrentKernel = 10,
};
struct KernelFields {
  static constexpr size_t start = 16, end = 24, device = 40, stream = 48,
                          correlation = 92, name = 104, graph_node = 144;
};
struct CopyFields {  // memcpy and memset records
  static constexpr size_t start = 16, end = 24, device = 32, stream = 40,
                          correlation = 44, graph_node = 64;
};

using CallbackFunc = void (*)(void* userdata, uint32_t domain, uint32_t cbid, const void* data);
using BufferRequestedFunc = void (*)(uint8_t** buffer, size_t* size, size_t* max_records);
using BufferCompletedFunc = void (*)(void* context, uint32_t stream, uint8_t* buffer,
                                     size_t size, size_t valid_size);

// The entry points, by the names libcupti exports.
struct Api {
  Result (*subscribe)(Subscriber*, CallbackFunc, void*) = nullptr;          // cuptiSubscribe
  Result (*unsubscribe)(Subscriber) = nullptr;                              // cuptiUnsubscribe
  Result (*enable_callback)(uint32_t, Subscriber, uint32_t, uint32_t) = nullptr;
  Result (*register_callbacks)(BufferRequestedFunc, BufferCompletedFunc) = nullptr;
  Result (*activity_enable)(uint32_t) = nullptr;
  Result (*activity_disable)(uint32_t) = nullptr;
  Result (*flush_all)(uint32_t) = nullptr;                                  // cuptiActivityFlushAll
  Result (*next_record)(uint8_t*, size_t, void**) = nullptr;                // cuptiActivityGetNextRecord
  Result (*dropped_records)(void*, uint32_t, size_t*) = nullptr;            // ...GetNumDroppedRecords
  Result (*timestamp)(uint64_t*) = nullptr;                                 // cuptiGetTimestamp
  Result (*graph_node_id)(void*, uint64_t*) = nullptr;                      // cuptiGetGraphNodeId
  Result (*result_string)(Result, const char**) = nullptr;                  // cuptiGetResultString
};

}  // namespace cupti
}  // namespace hooktrace

// AddressSanitizer hooks for fibers and the shared-memory arena; no-ops without ASan.
// The annotations follow shared/reference/simt-emulator.md point 4:
//   before every switch   __sanitizer_start_switch_fiber(&from->fake_stack, to_bottom, to_size)
//                         (nullptr instead of &fake_stack when `from` never runs again)
//   after it returns      __sanitizer_finish_switch_fiber(from->fake_stack, ...)
//   a new fiber's entry   __sanitizer_finish_switch_fiber(nullptr, ...)
#ifndef K3_SIMT_ASAN_H
#define K3_SIMT_ASAN_H

#include <stddef.h>

#if defined(__SANITIZE_ADDRESS__)
#define K3_SIMT_HAS_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define K3_SIMT_HAS_ASAN 1
#endif
#endif

#if defined(K3_SIMT_HAS_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

namespace k3 {
namespace simt {

#if defined(K3_SIMT_HAS_ASAN)
constexpr bool kAsan = true;
inline void asan_start_switch(void** fake_stack_save, const void* bottom, size_t size) {
  __sanitizer_start_switch_fiber(fake_stack_save, bottom, size);
}
inline void asan_finish_switch(void* fake_stack_save) {
  __sanitizer_finish_switch_fiber(fake_stack_save, nullptr, nullptr);
}
inline void asan_poison(const void* p, size_t n) { __asan_poison_memory_region(p, n); }
inline void asan_unpoison(const void* p, size_t n) { __asan_unpoison_memory_region(p, n); }
#else
constexpr bool kAsan = false;
inline void asan_start_switch(void**, const void*, size_t) {}
inline void asan_finish_switch(void*) {}
inline void asan_poison(const void*, size_t) {}
inline void asan_unpoison(const void*, size_t) {}
#endif

}  // namespace simt
}  // namespace k3

#endif  // K3_SIMT_ASAN_H

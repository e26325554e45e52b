/*
 * rt.c -- the freestanding runtime of the Hexagon test driver: _start, write/exit through
 * trap0(#1) (Linux syscall numbers 64 and 93 in r6, as qemu-hexagon's linux-user mode expects),
 * and the few helpers clang emits calls to (memcpy/memset/memmove, integer division, Hexagon's
 * aligned memcpy). No libc, no malloc: the driver uses static arenas.
 *
 * Built with -ffreestanding -fno-builtin so the helpers below are not turned back into calls to
 * themselves.
 */
#include <stddef.h>
#include <stdint.h>

int main(int argc, char **argv);

/* Entry: r29 points at argc, argv[0..argc), NULL, envp... Align the stack for HVX spills and call
 * into C with the original stack pointer. */
__asm__(".text\n"
        ".globl _start\n"
        ".type _start,@function\n"
        "_start:\n"
        "  r0 = r29\n"
        "  r29 = and(r29, #-256)\n"
        "  r30 = #0\n"
        "  call rt_start_c\n"
        ".size _start, .-_start\n");

static long rt_syscall3(long n, long a, long b, long c) {
    register long r0 __asm__("r0") = a;
    register long r1 __asm__("r1") = b;
    register long r2 __asm__("r2") = c;
    register long r6 __asm__("r6") = n;
    __asm__ volatile("trap0(#1)" : "+r"(r0) : "r"(r1), "r"(r2), "r"(r6) : "memory");
    return r0;
}

void rt_write(int fd, const void *buf, uint32_t len) {
    const uint8_t *p = (const uint8_t *)buf;
    while (len > 0) {
        const long n = rt_syscall3(64, fd, (long)(uintptr_t)p, (long)len);
        if (n <= 0) {
            return;
        }
        p += n;
        len -= (uint32_t)n;
    }
}

__attribute__((noreturn)) void rt_exit(int code) {
    for (;;) {
        rt_syscall3(94, code, 0, 0); /* exit_group */
        rt_syscall3(93, code, 0, 0); /* exit */
    }
}

__attribute__((noreturn, used)) void rt_start_c(uint32_t *sp) {
    const int argc = (int)sp[0];
    char **argv = (char **)(void *)(sp + 1);
    rt_exit(main(argc, argv));
}

void *memcpy(void *dst, const void *src, size_t n) {
    uint8_t *d = (uint8_t *)dst;
    const uint8_t *s = (const uint8_t *)src;
    for (size_t i = 0; i < n; i++) {
        d[i] = s[i];
    }
    return dst;
}

void *memmove(void *dst, const void *src, size_t n) {
    uint8_t *d = (uint8_t *)dst;
    const uint8_t *s = (const uint8_t *)src;
    if (d < s) {
        for (size_t i = 0; i < n; i++) {
            d[i] = s[i];
        }
    } else {
        for (size_t i = n; i > 0; i--) {
            d[i - 1] = s[i - 1];
        }
    }
    return dst;
}

void *memset(void *dst, int c, size_t n) {
    uint8_t *d = (uint8_t *)dst;
    for (size_t i = 0; i < n; i++) {
        d[i] = (uint8_t)c;
    }
    return dst;
}

void *__hexagon_memcpy_likely_aligned_min32bytes_mult8bytes(void *dst, const void *src, uint32_t n) {
    return memcpy(dst, src, n);
}

/* Shift-subtract division; x / 0 gives 0 (never reached: kernels validate divisors first). */
static uint64_t rt_udivmod64(uint64_t n, uint64_t d, uint64_t *rem) {
    uint64_t q = 0;
    uint64_t r = 0;
    if (d == 0) {
        *rem = 0;
        return 0;
    }
    for (int i = 63; i >= 0; i--) {
        r = (r << 1) | ((n >> i) & 1u);
        if (r >= d) {
            r -= d;
            q |= (uint64_t)1 << i;
        }
    }
    *rem = r;
    return q;
}

static uint32_t rt_udivmod32(uint32_t n, uint32_t d, uint32_t *rem) {
    uint32_t q = 0;
    uint32_t r = 0;
    if (d == 0) {
        *rem = 0;
        return 0;
    }
    for (int i = 31; i >= 0; i--) {
        r = (r << 1) | ((n >> i) & 1u);
        if (r >= d) {
            r -= d;
            q |= 1u << i;
        }
    }
    *rem = r;
    return q;
}

uint32_t __hexagon_udivsi3(uint32_t n, uint32_t d) {
    uint32_t r;
    return rt_udivmod32(n, d, &r);
}

uint32_t __hexagon_umodsi3(uint32_t n, uint32_t d) {
    uint32_t r;
    rt_udivmod32(n, d, &r);
    return r;
}

int32_t __hexagon_divsi3(int32_t n, int32_t d) {
    uint32_t r;
    const uint32_t un = n < 0 ? 0u - (uint32_t)n : (uint32_t)n;
    const uint32_t ud = d < 0 ? 0u - (uint32_t)d : (uint32_t)d;
    const uint32_t q = rt_udivmod32(un, ud, &r);
    return (n < 0) != (d < 0) ? -(int32_t)q : (int32_t)q;
}

int32_t __hexagon_modsi3(int32_t n, int32_t d) {
    uint32_t r;
    const uint32_t un = n < 0 ? 0u - (uint32_t)n : (uint32_t)n;
    const uint32_t ud = d < 0 ? 0u - (uint32_t)d : (uint32_t)d;
    rt_udivmod32(un, ud, &r);
    return n < 0 ? -(int32_t)r : (int32_t)r;
}

uint64_t __hexagon_udivdi3(uint64_t n, uint64_t d) {
    uint64_t r;
    return rt_udivmod64(n, d, &r);
}

uint64_t __hexagon_umoddi3(uint64_t n, uint64_t d) {
    uint64_t r;
    rt_udivmod64(n, d, &r);
    return r;
}

int64_t __hexagon_divdi3(int64_t n, int64_t d) {
    uint64_t r;
    const uint64_t un = n < 0 ? 0u - (uint64_t)n : (uint64_t)n;
    const uint64_t ud = d < 0 ? 0u - (uint64_t)d : (uint64_t)d;
    const uint64_t q = rt_udivmod64(un, ud, &r);
    return (n < 0) != (d < 0) ? -(int64_t)q : (int64_t)q;
}

int64_t __hexagon_moddi3(int64_t n, int64_t d) {
    uint64_t r;
    const uint64_t un = n < 0 ? 0u - (uint64_t)n : (uint64_t)n;
    const uint64_t ud = d < 0 ? 0u - (uint64_t)d : (uint64_t)d;
    rt_udivmod64(un, ud, &r);
    return n < 0 ? -(int64_t)r : (int64_t)r;
}

/*
 * fastrpc_shim.c -- a host stand-in for libcdsprpc.so: the same C ABI (rpcmem_*, fastrpc_mmap /
 * fastrpc_munmap, remote_handle64_*, remote_session_control), served by the kdsp skel running
 * the kernels-dsp host build. It exists so candle-hexagon's FastRPC transport can be tested end
 * to end without a phone.
 *
 * What it models, and how:
 * - rpcmem: rpcmem_alloc returns a MAP_SHARED mapping of a fresh memfd (the dma-buf stand-in);
 *   rpcmem_to_fd returns that fd. Heap ids other than SYSTEM (25) are refused.
 * - the DSP process address space: a PROT_NONE reservation of KDSP_SHIM_VA_BYTES (default
 *   3000 MiB, like a v73 session). fastrpc_mmap(FASTRPC_MAP_FD) maps a page-aligned range of the
 *   fd (offset, length; several disjoint ranges of one fd may be mapped) a second time, at a
 *   first-fit address inside it, so the DSP side reaches the pages only through the fd;
 *   exhaustion returns AEE_ENOMEMORY.
 * - FastRPC copy semantics: input buffers are copied into DSP-side (aligned) buffers before the
 *   method runs, output buffers are copied back after.
 * - session rules: remote_handle64_open needs the `&_dom=cdsp` suffix, the kdsp skel URI, and an
 *   earlier remote_session_control(DSPRPC_CONTROL_UNSIGNED_MODULE) for the CDSP (an unsigned skel
 *   cannot be loaded into a signed PD).
 * What it does not model: real SMMU mappings, cache maintenance, DSP clocks, signing, the
 * 2 GB-per-mapping limit of v73, per-process session limits, latency.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kdsp_rpc.h"
#include "kdsp_skel.h"

#define API __attribute__((visibility("default")))

#define CDSP_DOMAIN_ID 3
#define RPCMEM_HEAP_ID_SYSTEM 25
#define FASTRPC_MAP_FD 2
#define DSPRPC_CONTROL_UNSIGNED_MODULE 2
#define SHIM_MAX 4096
#define SHIM_DEFAULT_VA (3000ull << 20)

struct remote_rpc_control_unsigned_module {
    int domain;
    int enable;
};

typedef struct {
    uint8_t *ptr;
    size_t len;
    int fd;
} shim_rpcmem;

typedef struct {
    int fd;
    uint8_t *host;  /* host address of the range (the fd's mapping + foff) */
    uint64_t foff;  /* offset of the range in the fd */
    uint64_t off;   /* offset in the DSP window */
    uint64_t len;
} shim_map;

typedef struct {
    kdsp_skel_session *skel;
    pthread_mutex_t lock;
} shim_session;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static shim_rpcmem g_mem[SHIM_MAX];
static size_t g_nmem;
static shim_map g_map[SHIM_MAX]; /* sorted by off */
static size_t g_nmap;
static uint8_t *g_window;
static uint64_t g_window_len;
static int g_unsigned_pd;
static shim_session *g_sessions[64];
static uint64_t g_stats_maps, g_stats_unmaps, g_stats_invokes;

static size_t shim_page(void) {
    const long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (size_t)p : 4096u;
}

/* ---- rpcmem ---- */

API void *rpcmem_alloc(int heapid, uint32_t flags, int size) {
    (void)flags;
    if (heapid != RPCMEM_HEAP_ID_SYSTEM || size <= 0) {
        return NULL;
    }
    const size_t page = shim_page();
    const size_t len = ((size_t)size + page - 1) / page * page;
    const int fd = memfd_create("rpcmem", MFD_CLOEXEC);
    if (fd < 0) {
        return NULL;
    }
    if (ftruncate(fd, (off_t)len) != 0) {
        close(fd);
        return NULL;
    }
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        close(fd);
        return NULL;
    }
    pthread_mutex_lock(&g_lock);
    if (g_nmem == SHIM_MAX) {
        pthread_mutex_unlock(&g_lock);
        munmap(p, len);
        close(fd);
        return NULL;
    }
    g_mem[g_nmem++] = (shim_rpcmem){(uint8_t *)p, len, fd};
    pthread_mutex_unlock(&g_lock);
    return p;
}

API void rpcmem_free(void *po) {
    pthread_mutex_lock(&g_lock);
    for (size_t i = 0; i < g_nmem; i++) {
        if (g_mem[i].ptr == po) {
            shim_rpcmem m = g_mem[i];
            g_mem[i] = g_mem[--g_nmem];
            pthread_mutex_unlock(&g_lock);
            munmap(m.ptr, m.len);
            close(m.fd);
            return;
        }
    }
    pthread_mutex_unlock(&g_lock); /* invalid buffers are ignored, as documented */
}

API int rpcmem_to_fd(void *po) {
    int fd = -1;
    pthread_mutex_lock(&g_lock);
    for (size_t i = 0; i < g_nmem; i++) {
        if (g_mem[i].ptr == po) {
            fd = g_mem[i].fd;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return fd;
}

/* ---- the DSP address window ---- */

static int shim_window_init_locked(void) {
    if (g_window != NULL) {
        return 0;
    }
    uint64_t len = SHIM_DEFAULT_VA;
    const char *env = getenv("KDSP_SHIM_VA_BYTES");
    if (env != NULL && *env != '\0') {
        char *end = NULL;
        const unsigned long long v = strtoull(env, &end, 10);
        if (end != NULL && *end == '\0' && v > 0) {
            len = v;
        }
    }
    const size_t page = shim_page();
    len = (len + page - 1) / page * page;
    void *p = mmap(NULL, (size_t)len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        return -1;
    }
    g_window = (uint8_t *)p;
    g_window_len = len;
    return 0;
}

API int fastrpc_mmap(int domain, int fd, void *addr, int offset, size_t length, int flags) {
    if (domain != CDSP_DOMAIN_ID && domain != -1) {
        return AEE_EINVALIDDOMAIN;
    }
    if (flags != FASTRPC_MAP_FD) {
        return AEE_EUNSUPPORTED;
    }
    const size_t page = shim_page();
    if (offset < 0 || (size_t)offset % page != 0 || length == 0 || length % page != 0) {
        return AEE_EBADPARM;
    }
    pthread_mutex_lock(&g_lock);
    int rc = AEE_EINVALIDFD;
    const shim_rpcmem *m = NULL;
    for (size_t i = 0; i < g_nmem; i++) {
        if (g_mem[i].fd == fd) {
            m = &g_mem[i];
        }
    }
    if (m == NULL) {
        goto out;
    }
    rc = AEE_EBADPARM;
    if (addr != m->ptr + offset || (size_t)offset + length > m->len) {
        goto out; /* addr must be the host mapping of the fd's range */
    }
    rc = AEE_EALREADY; /* a range of the fd overlapping one already mapped */
    for (size_t i = 0; i < g_nmap; i++) {
        if (g_map[i].fd == fd && g_map[i].foff < (uint64_t)offset + length &&
            (uint64_t)offset < g_map[i].foff + g_map[i].len) {
            goto out;
        }
    }
    rc = AEE_ENOMEMORY;
    if (g_nmap == SHIM_MAX || shim_window_init_locked() != 0) {
        goto out;
    }
    /* first fit in the gaps between sorted mappings */
    uint64_t at = 0;
    size_t slot = 0;
    for (; slot < g_nmap; slot++) {
        if (g_map[slot].off - at >= length) {
            break;
        }
        at = g_map[slot].off + g_map[slot].len;
    }
    if (at + length > g_window_len) {
        goto out;
    }
    void *p = mmap(g_window + at, length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, offset);
    if (p == MAP_FAILED) {
        rc = AEE_EFAILED;
        goto out;
    }
    memmove(&g_map[slot + 1], &g_map[slot], (g_nmap - slot) * sizeof(shim_map));
    g_map[slot] = (shim_map){fd, (uint8_t *)addr, (uint64_t)offset, at, length};
    g_nmap++;
    g_stats_maps++;
    rc = AEE_SUCCESS;
out:
    pthread_mutex_unlock(&g_lock);
    return rc;
}

API int fastrpc_munmap(int domain, int fd, void *addr, size_t length) {
    if (domain != CDSP_DOMAIN_ID && domain != -1) {
        return AEE_EINVALIDDOMAIN;
    }
    pthread_mutex_lock(&g_lock);
    int rc = AEE_EINVALIDFD;
    for (size_t i = 0; i < g_nmap; i++) {
        if (g_map[i].fd != fd || g_map[i].host != addr) {
            continue;
        }
        if (g_map[i].len != length) {
            rc = AEE_EBADPARM;
            break;
        }
        /* back to a placeholder in one call, so nothing else can land in the hole */
        if (mmap(g_window + g_map[i].off, length, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE,
                 -1, 0) == MAP_FAILED) {
            rc = AEE_EFAILED;
            break;
        }
        memmove(&g_map[i], &g_map[i + 1], (g_nmap - i - 1) * sizeof(shim_map));
        g_nmap--;
        g_stats_unmaps++;
        rc = AEE_SUCCESS;
        break;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

/* kdsp_skel.h platform layer: what HAP_mmap_get does on the DSP. The mapped range of `fd`
 * holding bytes [offset, offset + size) of it: its DSP address for `offset`. */
int kdsp_plat_fd_lookup(int fd, uint64_t offset, uint64_t size, uint8_t **addr) {
    int rc = -1;
    pthread_mutex_lock(&g_lock);
    for (size_t i = 0; i < g_nmap; i++) {
        const shim_map *m = &g_map[i];
        if (m->fd == fd && offset >= m->foff && size <= m->len && offset - m->foff <= m->len - size) {
            *addr = g_window + m->off + (offset - m->foff);
            rc = 0;
            break;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

void *kdsp_plat_alloc(size_t bytes, size_t align) {
    void *p = NULL;
    if (posix_memalign(&p, align < sizeof(void *) ? sizeof(void *) : align, bytes ? bytes : 1) != 0) {
        return NULL;
    }
    return p;
}

void kdsp_plat_free(void *p) {
    free(p);
}

/* ---- sessions ---- */

API int remote_session_control(uint32_t req, void *data, uint32_t datalen) {
    if (req != DSPRPC_CONTROL_UNSIGNED_MODULE) {
        return AEE_EUNSUPPORTEDAPI;
    }
    if (data == NULL || datalen != sizeof(struct remote_rpc_control_unsigned_module)) {
        return AEE_EBADPARM;
    }
    struct remote_rpc_control_unsigned_module u;
    memcpy(&u, data, sizeof(u));
    if (u.domain != CDSP_DOMAIN_ID && u.domain != -1) {
        return AEE_EINVALIDDOMAIN;
    }
    pthread_mutex_lock(&g_lock);
    g_unsigned_pd = u.enable != 0;
    pthread_mutex_unlock(&g_lock);
    return AEE_SUCCESS;
}

static int shim_session_index_locked(remote_handle64 h) {
    for (int i = 0; i < 64; i++) {
        if (g_sessions[i] != NULL && (remote_handle64)(uintptr_t)g_sessions[i] == h) {
            return i;
        }
    }
    return -1;
}

API int remote_handle64_open(const char *name, remote_handle64 *ph) {
    if (name == NULL || ph == NULL) {
        return AEE_EBADPARM;
    }
    const size_t base = strlen(KDSP_RPC_URI);
    if (strncmp(name, KDSP_RPC_URI, base) != 0) {
        return AEE_ENOSUCHMOD;
    }
    if (strstr(name + base, "&_dom=cdsp") == NULL) {
        return AEE_EINVALIDDOMAIN;
    }
    pthread_mutex_lock(&g_lock);
    const int unsigned_pd = g_unsigned_pd;
    pthread_mutex_unlock(&g_lock);
    if (!unsigned_pd) {
        return AEE_EUNSIGNEDMOD;
    }
    shim_session *s = (shim_session *)calloc(1, sizeof(*s));
    if (s == NULL) {
        return AEE_ENOMEMORY;
    }
    const int rc = kdsp_skel_open(&s->skel);
    if (rc != AEE_SUCCESS) {
        free(s);
        return rc;
    }
    pthread_mutex_init(&s->lock, NULL);
    pthread_mutex_lock(&g_lock);
    int slot = -1;
    for (int i = 0; i < 64 && slot < 0; i++) {
        if (g_sessions[i] == NULL) {
            slot = i;
        }
    }
    if (slot >= 0) {
        g_sessions[slot] = s;
    }
    pthread_mutex_unlock(&g_lock);
    if (slot < 0) {
        kdsp_skel_close(s->skel);
        pthread_mutex_destroy(&s->lock);
        free(s);
        return AEE_ENOMEMORY;
    }
    *ph = (remote_handle64)(uintptr_t)s;
    return AEE_SUCCESS;
}

API int remote_handle64_close(remote_handle64 h) {
    pthread_mutex_lock(&g_lock);
    const int i = shim_session_index_locked(h);
    shim_session *s = i >= 0 ? g_sessions[i] : NULL;
    if (i >= 0) {
        g_sessions[i] = NULL;
    }
    pthread_mutex_unlock(&g_lock);
    if (s == NULL) {
        return AEE_EINVHANDLE;
    }
    pthread_mutex_lock(&s->lock);
    kdsp_skel_close(s->skel);
    pthread_mutex_unlock(&s->lock);
    pthread_mutex_destroy(&s->lock);
    free(s);
    return AEE_SUCCESS;
}

API int remote_handle64_invoke(remote_handle64 h, uint32_t sc, remote_arg *pra) {
    pthread_mutex_lock(&g_lock);
    const int i = shim_session_index_locked(h);
    shim_session *s = i >= 0 ? g_sessions[i] : NULL;
    g_stats_invokes++;
    pthread_mutex_unlock(&g_lock);
    if (s == NULL) {
        return AEE_EINVHANDLE;
    }
    const uint32_t nin = REMOTE_SCALARS_INBUFS(sc), nout = REMOTE_SCALARS_OUTBUFS(sc);
    if (REMOTE_SCALARS_INHANDLES(sc) != 0 || REMOTE_SCALARS_OUTHANDLES(sc) != 0 || nin + nout > 16 ||
        (pra == NULL && nin + nout != 0)) {
        return AEE_EBADPARM;
    }
    /* DSP-side copies of every buffer (FastRPC copies non-mapped arguments). */
    remote_arg dsp[16];
    int rc = AEE_SUCCESS;
    uint32_t made = 0;
    for (; made < nin + nout; made++) {
        const size_t n = pra[made].buf.nLen;
        void *p = kdsp_plat_alloc(n ? n : 1, 128);
        if (p == NULL || (n != 0 && pra[made].buf.pv == NULL)) {
            kdsp_plat_free(p);
            rc = p == NULL ? AEE_ENOMEMORY : AEE_EBADPARM;
            break;
        }
        if (made < nin) {
            memcpy(p, pra[made].buf.pv, n);
        } else {
            memset(p, 0, n ? n : 1);
        }
        dsp[made].buf.pv = p;
        dsp[made].buf.nLen = n;
    }
    if (rc == AEE_SUCCESS) {
        pthread_mutex_lock(&s->lock);
        rc = kdsp_skel_invoke(s->skel, sc, dsp);
        pthread_mutex_unlock(&s->lock);
        for (uint32_t j = nin; j < nin + nout && rc == AEE_SUCCESS; j++) {
            memcpy(pra[j].buf.pv, dsp[j].buf.pv, pra[j].buf.nLen);
        }
    }
    for (uint32_t j = 0; j < made; j++) {
        kdsp_plat_free(dsp[j].buf.pv);
    }
    return rc;
}

/* Test hook (not part of libcdsprpc): live rpcmem buffers, live DSP mappings, total maps, total
 * unmaps, invocations, unsigned PD requested. */
API void kdsp_shim_stats(uint64_t out[6]) {
    pthread_mutex_lock(&g_lock);
    out[0] = g_nmem;
    out[1] = g_nmap;
    out[2] = g_stats_maps;
    out[3] = g_stats_unmaps;
    out[4] = g_stats_invokes;
    out[5] = (uint64_t)g_unsigned_pd;
    pthread_mutex_unlock(&g_lock);
}

/*
 * kdsp_skel.h -- the DSP side of the kdsp remote interface (see kdsp_rpc.h), written against a
 * tiny platform layer so the same method code serves the host shim and, with an SDK build, a
 * real skel:
 *
 *   platform call            host shim (fastrpc_shim.c)        Hexagon SDK (not built here)
 *   kdsp_plat_fd_lookup      the shim's fastrpc_mmap table      HAP_mmap_get(fd, &va, &pa)
 *   kdsp_plat_alloc/free     aligned_alloc/free                 memalign/free; VTCM via
 *                                                               HAP_compute_res for scratch
 *
 * The remote argument types mirror remote.h of the open FastRPC headers (32-bit remote_arg:
 * a union of {void *pv; size_t nLen} and handles).
 */
#ifndef KDSP_SKEL_H
#define KDSP_SKEL_H

#include <stddef.h>
#include <stdint.h>

typedef uint64_t remote_handle64;

typedef struct {
    void *pv;
    size_t nLen;
} remote_buf;

typedef struct {
    int32_t fd;
    uint32_t offset;
} remote_dma_handle;

typedef union {
    remote_buf buf;
    uint32_t h;
    remote_handle64 h64;
    remote_dma_handle dma;
} remote_arg;

#define REMOTE_SCALARS_METHOD(sc) (((sc) >> 24) & 0x1f)
#define REMOTE_SCALARS_INBUFS(sc) (((sc) >> 16) & 0x0ff)
#define REMOTE_SCALARS_OUTBUFS(sc) (((sc) >> 8) & 0x0ff)
#define REMOTE_SCALARS_INHANDLES(sc) (((sc) >> 4) & 0x0f)
#define REMOTE_SCALARS_OUTHANDLES(sc) ((sc) & 0x0f)

/* AEE error codes used by the skel and the shim (values of AEEStdErr.h, host offsets). */
#define AEE_SUCCESS 0
#define AEE_EFAILED 0x1
#define AEE_ENOMEMORY 0x2
#define AEE_EBADSTATE 0xD
#define AEE_EBADPARM 0xE
#define AEE_EUNSUPPORTED 0x14
#define AEE_EALREADY 0x1A
#define AEE_EINVHANDLE 0x2C
#define AEE_EINVALIDDOMAIN 0x39
#define AEE_EINVALIDFD 0x3A
#define AEE_ENOSUCHMOD 0x3E
#define AEE_ENOSUCHMAP 0x48
#define AEE_EBADSIZE 0x4D
#define AEE_EUNSUPPORTEDAPI 0x6C
#define AEE_EUNSIGNEDMOD 0x81

/* Platform layer. */
int kdsp_plat_fd_lookup(int fd, uint64_t offset, uint64_t size, uint8_t **addr);
void *kdsp_plat_alloc(size_t bytes, size_t align);
void kdsp_plat_free(void *p);

typedef struct kdsp_skel_session kdsp_skel_session;

/* Method 0 (open) of the interface. */
int kdsp_skel_open(kdsp_skel_session **out);
/* Method 1 (close): releases the kernels' context and workers. */
void kdsp_skel_close(kdsp_skel_session *s);
/* User methods (>= 2), dispatched on REMOTE_SCALARS_METHOD(sc). */
int kdsp_skel_invoke(kdsp_skel_session *s, uint32_t sc, remote_arg *pra);

#endif /* KDSP_SKEL_H */

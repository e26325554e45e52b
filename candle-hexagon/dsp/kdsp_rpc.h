/*
 * kdsp_rpc.h -- the remote interface of the kdsp skel: what a FastRPC client (candle-hexagon's
 * fastrpc transport) invokes on the DSP, and the messages it passes.
 *
 * Interface "kdsp_skel", loaded into an unsigned PD on the CDSP with
 *   remote_handle64_open("file:///libkdsp_skel.so?kdsp_skel_handle_invoke&_modver=1.0&_dom=cdsp")
 * Methods 0 and 1 of a remote_handle64 interface are open/close (handled by the framework);
 * user methods start at 2. Every method returns 0 or an AEE error code (transport level); the
 * kernels' own KDSP_STATUS_* values travel in output buffers. Scalars are little-endian,
 * fixed width, explicitly padded: the same bytes on the 64-bit host and the 32-bit DSP.
 *
 * | method | in buffers                      | out buffers                          |
 * |--------|---------------------------------|--------------------------------------|
 * | 2 init | kdsp_ctx_config (16 B)          | u32 status                           |
 * | 3 reg  | kdsp_rpc_register (24 B)        | u32 status                           |
 * | 4 unreg| u32 buffer id                   | u32 status                           |
 * | 5 exec | serialized batch (header + ops) | u32 status per op                    |
 * | 6 check| one kdsp_op (440 B)             | kdsp_rpc_check (16 B)                |
 * | 7 info | -                               | char[KDSP_RPC_INFO_BYTES], NUL-ended |
 *
 * A buffer is registered by file descriptor: the client maps the fd into the DSP process with
 * fastrpc_mmap(FASTRPC_MAP_FD) first, then the skel looks the DSP address up by fd (HAP_mmap_get
 * on a real DSP; the host shim's mapping table here) and calls kdsp_buffer_register.
 */
#ifndef KDSP_RPC_H
#define KDSP_RPC_H

#include <stdint.h>

#define KDSP_RPC_URI "file:///libkdsp_skel.so?kdsp_skel_handle_invoke&_modver=1.0"
#define KDSP_RPC_METHOD_INIT 2u
#define KDSP_RPC_METHOD_REGISTER 3u
#define KDSP_RPC_METHOD_UNREGISTER 4u
#define KDSP_RPC_METHOD_EXECUTE 5u
#define KDSP_RPC_METHOD_CHECK 6u
#define KDSP_RPC_METHOD_INFO 7u
#define KDSP_RPC_INFO_BYTES 128u

/** Method 3: make [fd mapping + offset, + size) buffer `id`. 24 bytes. */
typedef struct kdsp_rpc_register {
    uint32_t id;
    int32_t fd;
    uint32_t offset;
    uint32_t _pad0;
    uint64_t size;
} kdsp_rpc_register;

/** Method 6 output. 16 bytes. */
typedef struct kdsp_rpc_check {
    uint32_t status;
    uint32_t _pad0;
    uint64_t scratch_bytes;
} kdsp_rpc_check;

_Static_assert(sizeof(kdsp_rpc_register) == 24, "kdsp_rpc_register size");
_Static_assert(sizeof(kdsp_rpc_check) == 16, "kdsp_rpc_check size");

#endif /* KDSP_RPC_H */

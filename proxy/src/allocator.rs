//! The binary's allocator: jemalloc, with large blocks (request bodies of 256 KiB and more) served
//! from one shared arena whose freed pages are reused, and returned to the kernel by jemalloc's
//! background thread after its usual decay rather than the moment they are freed.
//!
//! Why jemalloc at all: the proxy allocates on one thread and frees on another all the time (a
//! body read by its connection is freed after the worker answers; a span ended on the request
//! path is freed by the export thread), which glibc's per-thread arenas paid for with
//! consolidation on the request path (docs/ARCHITECTURE.md, "Dependencies").
//!
//! Why these options, measured with 10 MB bodies (BENCHMARKS.md, "Large payload targets"):
//! - jemalloc's defaults serve blocks of 8 MiB and more from a shared arena and purge each the
//!   moment it is freed, so every body was read into fresh pages, faulted in one by one: 11–13 ms
//!   of the proxy's system time per request, p50 16 ms at 1 client;
//! - blocks left in the per-thread arenas (`oversize_threshold:0`) reuse their pages (3 ms, p50
//!   7 ms), but each thread's arena keeps its own, and peak memory doubled on two cores;
//! - with `background_thread:true` jemalloc purges freed blocks on its decay schedule (10 s) from
//!   a thread of its own, the shared arena included, instead of eagerly on the request path: the
//!   pages are reused whatever thread reads the next body (p50 7 ms), and peak memory stays the
//!   bodies in flight plus about 10 MB.
//!
//! `oversize_threshold:262144` sends blocks from 256 KiB (not 8 MiB) to the shared arena, so
//! bodies of a megabyte share pages too (at 1 MB × 8 clients the peak over the bodies in flight
//! went from 23 to 13 MB). Smaller blocks, nearly all of the proxy's, stay in the per-thread
//! arenas and their caches. `_RJEM_MALLOC_CONF` in the environment overrides both.

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's start-up options (its `malloc_conf`, with tikv's `_rjem_` prefix), read before the
/// first allocation. Linux only: jemalloc has no background threads on macOS, and refuses to start
/// when asked for them.
#[cfg(target_os = "linux")]
#[export_name = "_rjem_malloc_conf"]
static MALLOC_CONF: &[u8; 49] = b"oversize_threshold:262144,background_thread:true\0";

//! Shared memory for large request bodies: one memory file (`memfd`) that the proxy maps and
//! hands, read-only, to each worker that asks for it (`shm` in its hello). A body of
//! [`SHARED_FROM`] bytes and more is read from hyper's frames straight into a [`Slot`] of it, and
//! a batch tells such a worker where a payload lies (`payload_at`) instead of carrying it: the
//! worker copies a raw body once, out of its mapping into the item its model gets, and not one
//! byte of it crosses the worker's socket. A payload built around a body (a v2 row: a header and
//! a slice of the body) that is not one piece of the memory is gathered into a slot of its own
//! ([`SharedMemory::gather`]).
//!
//! Why: over the socket a 10 MB body was copied by the kernel into the socket and again out of
//! it, in ~208 KiB turns between the proxy and the worker: measured side by side, 2.7 ms a 10 MB
//! hop against 1.4 ms for a copy into shared memory and one out of it (BENCHMARKS.md, "Large
//! payload targets"). The memory file travels over the worker socket itself
//! (`SCM_RIGHTS`), so it needs nothing shared between the containers beyond that socket.
//!
//! A slot is the body's memory for as long as anything holds it: it becomes the job's payload as
//! a `Bytes` (`Bytes::from_owner`), so retries, weight rules and workers without `shm` read it
//! like any other payload, and it is free again when the last clone drops — after the worker's
//! answer, since the connection holds a batch's jobs until then. Slots are taken first-fit from a
//! free list; a full memory is no error: the body is read onto the heap as before. Pages are
//! taken from the kernel only as bodies first touch them.
//!
//! Only the proxy writes, and only into a slot nobody else holds yet. Workers cannot write at
//! all: the file is sealed once mapped (`F_SEAL_FUTURE_WRITE`: no write and no writable mapping
//! through any descriptor but the proxy's mapping made before; `F_SEAL_SHRINK`, `F_SEAL_GROW`:
//! its size is fixed, so no worker can cut pages from under the proxy), and they get a read-only
//! descriptor besides. A kernel without these seals (before Linux 5.1) gets no shared memory.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use corral_protocol::Payload;

use crate::metrics::metrics;

/// The smallest body read into shared memory: below it the socket costs less than a slot.
pub const SHARED_FROM: usize = 64 * 1024;

/// Slots start on page boundaries: a body's pages are then its own.
const ALIGN: usize = 4096;

/// The proxy's shared memory: a mapping of a memory file, and which parts of it are free.
pub struct SharedMemory {
    base: NonNull<u8>,
    size: usize,
    /// Read-only descriptor of the memory file, passed to workers.
    for_workers: OwnedFd,
    /// Free ranges, offset → length, never adjacent (freed ranges merge with their neighbours).
    free: Mutex<BTreeMap<usize, usize>>,
}

// SAFETY: the mapping lives as long as the struct, the free list is behind a mutex, and each
// slot's bytes are written only by the one `Slot` that owns them (see `Slot`).
unsafe impl Send for SharedMemory {}
unsafe impl Sync for SharedMemory {}

impl SharedMemory {
    /// Creates and maps `size` bytes (rounded up to a page). Fails where the system has no
    /// memory files or no `/proc` to open one read-only: the proxy then shares none.
    pub fn new(size: usize) -> io::Result<Arc<Self>> {
        let size = size
            .checked_next_multiple_of(ALIGN)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "size too large"))?;
        let (base, for_workers) = platform::map(size)?;
        let free = Mutex::new(BTreeMap::from([(0, size)]));
        Ok(Arc::new(Self { base, size, for_workers, free }))
    }

    /// Its size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The read-only descriptor a worker maps.
    pub fn for_workers(&self) -> BorrowedFd<'_> {
        self.for_workers.as_fd()
    }

    /// A slot of `capacity` bytes for a body, or None when no free range is that large (counted:
    /// the body goes to the heap).
    pub fn slot(self: &Arc<Self>, capacity: usize) -> Option<Slot> {
        let slot = self.take(capacity);
        if slot.is_none() {
            metrics().shared_memory_full.inc();
        }
        slot
    }

    /// A slot of `capacity` bytes, first fit.
    fn take(self: &Arc<Self>, capacity: usize) -> Option<Slot> {
        let taken = capacity.max(1).div_ceil(ALIGN) * ALIGN;
        let mut free = self.free.lock().expect("the free list's lock");
        let (&offset, &length) = free.iter().find(|(_, &length)| length >= taken)?;
        free.remove(&offset);
        metrics().shared_memory_used.add(taken as i64);
        if length > taken {
            free.insert(offset + taken, length - taken);
        }
        Some(Slot { memory: self.clone(), offset, capacity, taken, len: 0 })
    }

    /// A payload of [`SHARED_FROM`] bytes and more, gathered into one slot (one copy) so that a
    /// worker reads it from here instead of from its socket; None for one in one piece here
    /// already, a small one, or when no slot is free (not counted as a body that found it full).
    pub fn gather(self: &Arc<Self>, payload: &Payload) -> Option<Payload> {
        let here = matches!(payload.segments(), [one] if self.locate(one).is_some());
        if here || payload.len() < SHARED_FROM {
            return None;
        }
        let mut slot = self.take(payload.len())?;
        for segment in payload.segments() {
            // Cannot fail: the slot holds the payload's length.
            slot.extend_from_slice(segment);
        }
        Some(slot.freeze().into())
    }

    /// Where `bytes` lie in this memory, as `[offset, length]`, if they lie in it at all.
    pub fn locate(&self, bytes: &[u8]) -> Option<[u64; 2]> {
        let start = (bytes.as_ptr() as usize).checked_sub(self.base.as_ptr() as usize)?;
        (start + bytes.len() <= self.size).then_some([start as u64, bytes.len() as u64])
    }

    /// Bytes free, all ranges together.
    #[cfg(test)]
    fn free_bytes(&self) -> usize {
        self.free.lock().expect("the free list's lock").values().sum()
    }

    fn release(&self, offset: usize, taken: usize) {
        metrics().shared_memory_used.sub(taken as i64);
        let mut free = self.free.lock().expect("the free list's lock");
        let (mut start, mut length) = (offset, taken);
        if let Some((&before, &before_length)) = free.range(..offset).next_back() {
            if before + before_length == offset {
                free.remove(&before);
                (start, length) = (before, before_length + length);
            }
        }
        if let Some(after_length) = free.remove(&(offset + taken)) {
            length += after_length;
        }
        free.insert(start, length);
    }
}

impl Drop for SharedMemory {
    fn drop(&mut self) {
        // SAFETY: every slot holds an `Arc` of this memory, so none is left; the mapping is ours.
        unsafe { platform::unmap(self.base, self.size) };
    }
}

/// Part of the shared memory, filled front to back by its one owner, then frozen into `Bytes`.
pub struct Slot {
    memory: Arc<SharedMemory>,
    offset: usize,
    capacity: usize,
    /// What the free list gave (`capacity` rounded up to a page), given back on drop.
    taken: usize,
    len: usize,
}

impl Slot {
    /// Appends `data`; false (and nothing written) if it would pass the slot's capacity.
    pub fn extend_from_slice(&mut self, data: &[u8]) -> bool {
        if data.len() > self.capacity - self.len {
            return false;
        }
        // SAFETY: `[offset + len, offset + len + data.len())` lies inside this slot, which no one
        // else reads or writes until it is frozen (workers only see it after that).
        unsafe {
            let to = self.memory.base.as_ptr().add(self.offset + self.len);
            std::ptr::copy_nonoverlapping(data.as_ptr(), to, data.len());
        }
        self.len += data.len();
        true
    }

    /// What was written so far, to change in place (a header written last).
    pub fn filled_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `extend_from_slice`; `&mut self` makes this the only reference.
        unsafe {
            std::slice::from_raw_parts_mut(self.memory.base.as_ptr().add(self.offset), self.len)
        }
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The slot as read-only `Bytes`: its memory is free again once the last clone drops.
    pub fn freeze(self) -> Bytes {
        Bytes::from_owner(self)
    }
}

impl AsRef<[u8]> for Slot {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the written part of this slot; after `freeze` nobody writes it any more.
        unsafe { std::slice::from_raw_parts(self.memory.base.as_ptr().add(self.offset), self.len) }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.memory.release(self.offset, self.taken);
    }
}

#[cfg(target_os = "linux")]
mod platform {
    use std::ffi::CString;
    use std::io;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::ptr::NonNull;

    /// A memory file of `size` bytes mapped read-write here, and a read-only descriptor of it.
    pub fn map(size: usize) -> io::Result<(NonNull<u8>, OwnedFd)> {
        let name = CString::new("corral-bodies").expect("no NUL in the name");
        // SAFETY: plain system calls; each descriptor is owned as soon as it exists.
        let file = unsafe {
            let fd = libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING);
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            OwnedFd::from_raw_fd(fd)
        };
        if unsafe { libc::ftruncate(file.as_raw_fd(), size as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // Reopened read-only: a worker given this descriptor can only map the memory read-only.
        let path = CString::new(format!("/proc/self/fd/{}", file.as_raw_fd()))
            .expect("no NUL in the path");
        let for_workers = unsafe {
            let fd = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            OwnedFd::from_raw_fd(fd)
        };
        // SAFETY: a fresh shared mapping of the whole file; unmapped in `unmap`.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // Sealed before any descriptor leaves: from now on only this mapping writes, and the
        // size never changes.
        let seals =
            libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_FUTURE_WRITE | libc::F_SEAL_SEAL;
        // SAFETY: a plain system call on our own descriptor.
        if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
            let error = io::Error::last_os_error();
            // SAFETY: the mapping was made just above and nothing refers to it yet.
            unsafe { libc::munmap(base, size) };
            return Err(error);
        }
        // The mapping keeps the memory file alive; `file` closes here.
        let base = NonNull::new(base.cast::<u8>()).ok_or_else(|| io::Error::other("null map"))?;
        Ok((base, for_workers))
    }

    /// # Safety
    /// `base` and `size` must be a mapping made by [`map`], no longer used.
    pub unsafe fn unmap(base: NonNull<u8>, size: usize) {
        unsafe { libc::munmap(base.as_ptr().cast(), size) };
    }
}

#[cfg(not(target_os = "linux"))]
mod platform {
    use std::io;
    use std::os::fd::OwnedFd;
    use std::ptr::NonNull;

    pub fn map(_size: usize) -> io::Result<(NonNull<u8>, OwnedFd)> {
        Err(io::Error::new(io::ErrorKind::Unsupported, "memory files are Linux only"))
    }

    pub unsafe fn unmap(_base: NonNull<u8>, _size: usize) {}
}

/// The memory this process may use: the machine's, or its cgroup's limit where lower (a
/// container's); None where neither can be read.
pub fn memory_limit() -> Option<u64> {
    // SAFETY: sysconf reads a system value and has no preconditions.
    let (pages, page) =
        unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    let machine = (pages > 0 && page > 0).then(|| pages as u64 * page as u64);
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|text| text.trim().parse::<u64>().ok());
    match (machine, cgroup) {
        (Some(machine), Some(cgroup)) => Some(machine.min(cgroup)),
        (machine, cgroup) => machine.or(cgroup),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(target_os = "linux")]
    fn the_memory_a_process_may_use_is_known_on_linux() {
        assert!(memory_limit().is_some_and(|bytes| bytes > 1 << 20));
    }

    #[test]
    fn a_slot_becomes_bytes_that_lie_in_the_memory() {
        let memory = SharedMemory::new(1 << 20).unwrap();
        let mut slot = memory.slot(10).unwrap();
        assert!(slot.extend_from_slice(b"\0\0hello"));
        assert!(!slot.extend_from_slice(b"too long"), "past its capacity");
        slot.filled_mut()[..2].copy_from_slice(b"<>");
        let bytes = slot.freeze();
        assert_eq!(&bytes[..], b"<>hello");
        let [offset, length] = memory.locate(&bytes).unwrap();
        assert_eq!((offset % ALIGN as u64, length), (0, 7));
        assert_eq!(memory.locate(&bytes.slice(2..)), Some([offset + 2, 5]));
        assert_eq!(memory.locate(b"elsewhere"), None);
    }

    #[test]
    fn a_size_past_the_address_space_is_an_error_not_a_panic() {
        assert!(SharedMemory::new(usize::MAX).is_err());
    }

    #[test]
    fn freed_slots_merge_and_are_taken_again() {
        let memory = SharedMemory::new(4 * ALIGN).unwrap();
        let a = memory.slot(ALIGN).unwrap();
        let b = memory.slot(ALIGN + 1).unwrap(); // two pages
        let c = memory.slot(1).unwrap();
        assert!(memory.slot(1).is_none(), "full: the caller reads onto the heap");
        assert_eq!(memory.free_bytes(), 0);
        drop(a);
        drop(c);
        assert!(memory.slot(2 * ALIGN).is_none(), "two free pages, not adjacent");
        drop(b.freeze());
        assert_eq!(memory.free_bytes(), 4 * ALIGN);
        let whole = memory.slot(4 * ALIGN).expect("merged back into one range");
        assert_eq!(whole.offset, 0);
    }

    #[test]
    fn a_payload_in_pieces_is_gathered_into_one_slot() {
        let memory = SharedMemory::new(1 << 20).unwrap();
        let data = Bytes::from(vec![9u8; SHARED_FROM]);
        let pieces = Payload::from_segments([Bytes::from_static(b"head"), data.clone()]);
        let gathered = memory.gather(&pieces).unwrap();
        assert_eq!(gathered, pieces, "the same bytes");
        let [_, length] = memory.locate(&gathered.segments()[0]).expect("in the memory");
        assert_eq!(length as usize, SHARED_FROM + 4);
        assert!(memory.gather(&gathered).is_none(), "in one piece here already");
        let heap = memory.gather(&Payload::from(data)).expect("one piece on the heap is taken");
        assert!(memory.locate(&heap.segments()[0]).is_some());
        let small = Payload::from_segments([Bytes::from_static(b"a"), Bytes::from_static(b"b")]);
        assert!(memory.gather(&small).is_none(), "small: the socket costs less");
        let just_below = Payload::from_segments([
            Bytes::from_static(b"head"),
            Bytes::from(vec![9u8; SHARED_FROM - 5]),
        ]);
        assert!(memory.gather(&just_below).is_none(), "one byte short of SHARED_FROM");
    }

    #[test]
    fn a_clone_keeps_the_slot_taken() {
        let memory = SharedMemory::new(2 * ALIGN).unwrap();
        let mut slot = memory.slot(2 * ALIGN).unwrap();
        assert!(slot.extend_from_slice(&[7; 100]));
        let bytes = slot.freeze();
        let row = bytes.slice(10..20);
        drop(bytes);
        assert!(memory.slot(1).is_none(), "the slice still holds it");
        assert_eq!(&row[..], &[7; 10]);
        drop(row);
        assert!(memory.slot(2 * ALIGN).is_some());
    }
}

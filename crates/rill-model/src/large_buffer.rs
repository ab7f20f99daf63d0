//! Zeroed arrays for the data a token streams through: the repacked weights and the KV cache.
//! Each is its own anonymous mapping, started on a 2 MiB boundary and advised to use transparent
//! huge pages where the OS has them (Linux's `madvise` mode leaves ordinary allocations on
//! 4 KiB pages).
//!
//! Why: decoding reads ~250 MB of weights and the whole cache per token, a 4 KiB page at a time
//! for the TLB. Each new page costs a page walk, and under a hypervisor a two-level one. On the
//! development VM, Gemma 3's 178 MB Q8_0 head product runs at 21.0 GB/s from huge pages against
//! 17.4 GB/s from small ones (two threads, the same process, timed alternately).
//!
//! The pages are faulted in as they are first written, so an unused part of a large KV cache
//! costs no memory. Where the mapping cannot be had the caller gets `None`, never an abort.

use memmap2::MmapMut;
use std::marker::PhantomData;

/// The boundary a large buffer starts on: x86-64's (and most ARM kernels') huge page.
const HUGE_PAGE: usize = 2 << 20;

/// Element types whose all-zero bytes are the value zero, as a fresh mapping holds.
///
/// # Safety
/// Every bit pattern of all-zero bytes must be a valid value, and the type must have no drop
/// glue and no interior pointers.
pub(crate) unsafe trait Zeroable: Copy + Send + Sync + 'static {}

// SAFETY: plain numbers: zero bytes are zero.
unsafe impl Zeroable for u8 {}
// SAFETY: as above (+0.0).
unsafe impl Zeroable for f32 {}
// SAFETY: as above (+0.0).
unsafe impl Zeroable for half::f16 {}

/// `len` elements of `T`, zero until written.
pub(crate) struct LargeBuffer<T: Zeroable> {
    /// `None` for an empty buffer.
    map: Option<MmapMut>,
    /// Byte offset of element 0 in the mapping: the first huge-page boundary.
    start: usize,
    len: usize,
    _elements: PhantomData<T>,
}

impl<T: Zeroable> LargeBuffer<T> {
    /// `len` zero elements, or `None` when the memory cannot be had.
    pub(crate) fn zeroed(len: usize) -> Option<LargeBuffer<T>> {
        let bytes = len.checked_mul(std::mem::size_of::<T>())?;
        if bytes == 0 {
            return Some(LargeBuffer {
                map: None,
                start: 0,
                len,
                _elements: PhantomData,
            });
        }
        // Room to start on a huge-page boundary, for a buffer that fills at least one.
        let slack = if bytes >= HUGE_PAGE { HUGE_PAGE } else { 0 };
        let map = MmapMut::map_anon(bytes.checked_add(slack)?).ok()?;
        // A mapping is page-aligned, so the offset is below `slack` where there is slack (and
        // element 0 stays aligned for `T`, whose alignment divides a page's).
        let start = map.as_ptr().align_offset(HUGE_PAGE).min(slack);
        #[cfg(target_os = "linux")]
        if slack > 0 {
            // A hint: where the kernel has no transparent huge pages the buffer works the same.
            let _ = map.advise(memmap2::Advice::HugePage);
        }
        Some(LargeBuffer {
            map: Some(map),
            start,
            len,
            _elements: PhantomData,
        })
    }
}

impl<T: Zeroable> std::ops::Deref for LargeBuffer<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match &self.map {
            // SAFETY: the mapping holds `start + len * size_of::<T>()` bytes, aligned for `T`
            // at `start`, every byte pattern there valid (`Zeroable`); it lives as long as
            // `self` and is only written through `&mut self`.
            Some(map) => unsafe {
                std::slice::from_raw_parts(map.as_ptr().add(self.start).cast(), self.len)
            },
            None => &[],
        }
    }
}

impl<T: Zeroable> std::ops::DerefMut for LargeBuffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        let (start, len) = (self.start, self.len);
        match &mut self.map {
            // SAFETY: as for `deref`, with the mapping borrowed mutably.
            Some(map) => unsafe {
                std::slice::from_raw_parts_mut(map.as_mut_ptr().add(start).cast(), len)
            },
            None => &mut [],
        }
    }
}

impl<T: Zeroable> std::fmt::Debug for LargeBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LargeBuffer")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_of_every_size_start_zero_hold_what_is_written_and_are_aligned() {
        for len in [0usize, 1, 7, 4096, (2 << 20) - 1, 2 << 20, (5 << 20) + 3] {
            let mut b = LargeBuffer::<f32>::zeroed(len).unwrap();
            assert_eq!(b.len(), len);
            assert!(b.iter().all(|&x| x.to_bits() == 0));
            for (i, x) in b.iter_mut().enumerate() {
                *x = i as f32;
            }
            assert!(b.iter().enumerate().all(|(i, &x)| x == i as f32));
            if len * 4 >= HUGE_PAGE {
                assert_eq!(b.as_ptr() as usize % HUGE_PAGE, 0, "len {len}");
            } else if len > 0 {
                assert_eq!(b.as_ptr() as usize % 4, 0);
            }
        }
        let h = LargeBuffer::<half::f16>::zeroed(3).unwrap();
        assert_eq!(&h[..], &[half::f16::ZERO; 3]);
    }

    #[test]
    fn an_impossible_size_is_none_not_an_abort() {
        assert!(LargeBuffer::<f32>::zeroed(usize::MAX).is_none());
        assert!(LargeBuffer::<u8>::zeroed(usize::MAX / 2).is_none());
    }
}

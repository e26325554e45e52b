//! Growing a reused work buffer: the one helper the per-thread buffers ([`crate::scratch`]) and
//! the kernels that fill them share (below both, so neither imports the other for it).

/// The first `len` elements of `v`, growing it (never shrinking) to hold them. Contents are
/// whatever an earlier call left: callers write every element they read.
pub(crate) fn grow<T: Copy + Default>(v: &mut Vec<T>, len: usize) -> &mut [T] {
    if v.len() < len {
        v.resize(len, T::default());
    }
    &mut v[..len]
}

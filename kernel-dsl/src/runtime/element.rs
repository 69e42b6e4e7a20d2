//! Element types that buffers can hold.

use cudarc::driver::{DeviceRepr, ValidAsZeroBits};
use std::fmt::Debug;

use crate::ir::DType;

mod sealed {
    /// Keeps [`super::Element`] closed: only the types listed in this module qualify.
    pub trait Sealed {}
}

/// A plain-old-data element type a [`super::Buffer`] can hold.
///
/// Sealed: implemented for `f32`, `half::f16`, `half::bf16`, `i32`, `u32`, `i64` and `u8`.
/// Every bit pattern of these types is a valid value and they have no padding, which is
/// what lets a buffer be viewed as raw bytes (the interpreter's view of memory).
pub trait Element:
    sealed::Sealed
    + Copy
    + Send
    + Sync
    + Debug
    + PartialEq
    + Default
    + DeviceRepr
    + ValidAsZeroBits
    + 'static
{
    /// The IR dtype of this element type.
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
        }
    )*};
}

element!(
    f32 => F32,
    half::f16 => F16,
    half::bf16 => BF16,
    i32 => I32,
    u32 => U32,
    i64 => I64,
    u8 => U8,
);

/// Views a slice of elements as its native-endian bytes.
pub fn as_bytes<T: Element>(data: &[T]) -> &[u8] {
    // SAFETY: `Element` types are sealed POD types without padding; any initialized
    // value is a valid sequence of `size_of::<T>()` bytes, and `u8` has alignment 1.
    unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), std::mem::size_of_val(data)) }
}

/// Views a mutable slice of elements as its native-endian bytes.
pub fn as_bytes_mut<T: Element>(data: &mut [T]) -> &mut [u8] {
    let len = std::mem::size_of_val(data);
    // SAFETY: as in `as_bytes`; additionally every bit pattern is a valid `T` for the
    // sealed element types, so writes through the byte view cannot create invalid values.
    unsafe { std::slice::from_raw_parts_mut(data.as_mut_ptr().cast::<u8>(), len) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtypes_and_sizes_agree() {
        fn check<T: Element>() {
            assert_eq!(
                std::mem::size_of::<T>(),
                T::DTYPE.size_bytes(),
                "{}",
                T::DTYPE
            );
        }
        check::<f32>();
        check::<half::f16>();
        check::<half::bf16>();
        check::<i32>();
        check::<u32>();
        check::<i64>();
        check::<u8>();
    }

    #[test]
    fn byte_views() {
        let mut v = [1i32, -2];
        assert_eq!(as_bytes(&v).len(), 8);
        assert_eq!(&as_bytes(&v)[..4], &1i32.to_ne_bytes());
        as_bytes_mut(&mut v)[4..].copy_from_slice(&7i32.to_ne_bytes());
        assert_eq!(v, [1, 7]);
    }
}

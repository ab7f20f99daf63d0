use crate::QuantType;

/// Errors returned by the public kernel entry points.
///
/// Every public function validates buffer sizes up front and reports a mismatch with this type
/// instead of panicking, so that a malformed model file cannot crash the engine.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    /// The element count is not a whole number of blocks of the type.
    #[error("{n} elements is not a multiple of the {ty:?} block size {block}")]
    NotBlockMultiple {
        ty: QuantType,
        n: usize,
        block: usize,
    },
    /// A buffer has the wrong length.
    #[error("{what}: expected {expected} bytes/elements, got {actual}")]
    LengthMismatch {
        what: &'static str,
        expected: usize,
        actual: usize,
    },
    /// The operation is not implemented for the type (e.g. using an activation-only type as a
    /// weight type).
    #[error("{op} is not supported for {ty:?}")]
    Unsupported { ty: QuantType, op: &'static str },
    /// A size computation overflowed `usize`.
    #[error("size overflow")]
    Overflow,
}

/// Checks that `actual == expected`, naming the buffer in the error.
#[inline]
pub(crate) fn check_len(
    what: &'static str,
    expected: usize,
    actual: usize,
) -> Result<(), KernelError> {
    if expected == actual {
        Ok(())
    } else {
        Err(KernelError::LengthMismatch {
            what,
            expected,
            actual,
        })
    }
}

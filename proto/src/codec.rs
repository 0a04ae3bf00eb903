//! [`SizedCodec`]: the prost codec of the node's `ResourceService` server,
//! whose encoder reserves each answer's exact encoded length before writing it.
//!
//! Why: tonic encodes a message into one growing buffer that starts at 8 KiB.
//! prost writes field by field, and the buffer doubles as it fills, so a large
//! answer (a list page of 0.3 MB, a large resource) passed through every power
//! of two up to twice its size, and held the last two at once while copying:
//! about 2.7 times the answer at the peak. Reserved up front, an answer takes
//! one allocation of its own size (measured by the paging test: a node's peak
//! growth while `cairn list` pages 100,000 resources, `cli/tests/system/pages.rs`).
//!
//! Decoding is prost's, unchanged.

use std::marker::PhantomData;

use prost::Message;
use tonic::codec::{Codec, EncodeBuf, Encoder};
use tonic::Status;
use tonic_prost::ProstCodec;

/// `application/grpc+proto` through prost, encoding into a buffer reserved at
/// the message's size.
#[derive(Debug, Clone)]
pub struct SizedCodec<T, U> {
    _messages: PhantomData<(T, U)>,
}

impl<T, U> Default for SizedCodec<T, U> {
    fn default() -> Self {
        SizedCodec {
            _messages: PhantomData,
        }
    }
}

impl<T, U> Codec for SizedCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = SizedEncoder<T>;
    type Decoder = <ProstCodec<T, U> as Codec>::Decoder;

    fn encoder(&mut self) -> Self::Encoder {
        SizedEncoder {
            _message: PhantomData,
        }
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<T, U>::default().decoder()
    }
}

/// Encodes a `T` into a buffer first reserved at its encoded length.
#[derive(Debug, Clone)]
pub struct SizedEncoder<T> {
    _message: PhantomData<T>,
}

impl<T: Message> Encoder for SizedEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        // Reserved here, so prost's own length check (`encode`) would only
        // measure the message a second time.
        buf.reserve(item.encoded_len());
        item.encode_raw(buf);
        Ok(())
    }
}

//! Codecs: how record values turn into typed values and back. A decode failure is permanent and sends
//! the record to the DLQ with its bytes untouched (error kind `decode`), unless the codec says it is
//! transient (a schema registry that cannot be reached): then the record is retried like any
//! transient failure.
//!
//! The traits are async because a codec may have to ask a schema registry for a schema (see
//! [`avro`](crate::avro)); the codecs here ([`Raw`], [`Utf8`], [`Json`]) never wait.
//!
//! ```
//! use millrace::codec::{Decode, Encode, Json};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize, PartialEq, Debug)]
//! struct Order { id: u64 }
//!
//! # futures::executor::block_on(async {
//! let bytes = Json.encode("orders", &Order { id: 7 }).await.unwrap();
//! assert_eq!(Decode::<Order>::decode(&Json, Some(&bytes)).await.unwrap(), Order { id: 7 });
//! assert!(Decode::<Order>::decode(&Json, Some(b"{oops")).await.is_err());
//! assert!(Decode::<Order>::decode(&Json, None).await.is_err()); // a tombstone has no order in it
//! # });
//! ```

use serde::Serialize;
use serde::de::DeserializeOwned;
use std::future::{Future, ready};

/// Why a value could not be decoded or encoded.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// The record has no value (a tombstone) where one is required.
    #[error("the record has no value")]
    Missing,
    /// The bytes (or the value to encode) are not valid for this codec.
    #[error("{codec}: {message}")]
    Invalid {
        /// The codec's name.
        codec: &'static str,
        /// What is wrong.
        message: String,
    },
    /// The value names a schema id the schema registry does not know.
    #[error("schema id {id} is unknown to the schema registry")]
    UnknownSchema {
        /// The id read from the value's header.
        id: u32,
    },
    /// The schema registry could not be reached or failed (connection refused, timeout, a 5xx, a
    /// refused credential): transient, the record is retried.
    #[error("schema registry unavailable: {message}")]
    RegistryUnavailable {
        /// What went wrong.
        message: String,
    },
}

impl CodecError {
    /// Whether retrying can help: only when the schema registry was unavailable. Every other codec
    /// error is about the bytes or the value, which a retry does not change.
    pub fn is_transient(&self) -> bool {
        matches!(self, CodecError::RegistryUnavailable { .. })
    }
}

/// Turns value bytes into `T`.
pub trait Decode<T>: Send + Sync + 'static {
    /// Decodes a record value (`None` for a null value).
    fn decode(&self, bytes: Option<&[u8]>) -> impl Future<Output = Result<T, CodecError>> + Send;
}

/// Turns `T` into value bytes for a record to `topic` (the topic matters to codecs whose schema
/// subject is named after it).
pub trait Encode<T>: Send + Sync + 'static {
    /// Encodes a value.
    fn encode(&self, topic: &str, value: &T) -> impl Future<Output = Result<Vec<u8>, CodecError>> + Send;
}

/// The value bytes as they are.
#[derive(Debug, Clone, Copy, Default)]
pub struct Raw;

impl Decode<Vec<u8>> for Raw {
    fn decode(&self, bytes: Option<&[u8]>) -> impl Future<Output = Result<Vec<u8>, CodecError>> + Send {
        ready(bytes.map(<[u8]>::to_vec).ok_or(CodecError::Missing))
    }
}

impl Encode<Vec<u8>> for Raw {
    fn encode(&self, _topic: &str, value: &Vec<u8>) -> impl Future<Output = Result<Vec<u8>, CodecError>> + Send {
        ready(Ok(value.clone()))
    }
}

/// UTF-8 text.
#[derive(Debug, Clone, Copy, Default)]
pub struct Utf8;

impl Decode<String> for Utf8 {
    fn decode(&self, bytes: Option<&[u8]>) -> impl Future<Output = Result<String, CodecError>> + Send {
        ready(bytes.ok_or(CodecError::Missing).and_then(|bytes| {
            String::from_utf8(bytes.to_vec())
                .map_err(|e| CodecError::Invalid { codec: "utf-8", message: e.to_string() })
        }))
    }
}

impl Encode<String> for Utf8 {
    fn encode(&self, _topic: &str, value: &String) -> impl Future<Output = Result<Vec<u8>, CodecError>> + Send {
        ready(Ok(value.as_bytes().to_vec()))
    }
}

/// JSON through serde.
#[derive(Debug, Clone, Copy, Default)]
pub struct Json;

impl<T: DeserializeOwned + Send> Decode<T> for Json {
    fn decode(&self, bytes: Option<&[u8]>) -> impl Future<Output = Result<T, CodecError>> + Send {
        ready(bytes.ok_or(CodecError::Missing).and_then(|bytes| {
            serde_json::from_slice(bytes).map_err(|e| CodecError::Invalid { codec: "json", message: e.to_string() })
        }))
    }
}

impl<T: Serialize + Sync> Encode<T> for Json {
    fn encode(&self, _topic: &str, value: &T) -> impl Future<Output = Result<Vec<u8>, CodecError>> + Send {
        ready(serde_json::to_vec(value).map_err(|e| CodecError::Invalid { codec: "json", message: e.to_string() }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use futures::executor::block_on;

    #[test]
    fn utf8_and_raw_round_trip_and_reject() {
        block_on(async {
            assert_eq!(Utf8.decode(Some("héllo".as_bytes())).await.unwrap(), "héllo");
            assert!(matches!(Utf8.decode(Some(&[0xff, 0xfe])).await, Err(CodecError::Invalid { .. })));
            assert!(matches!(Utf8.decode(None).await, Err(CodecError::Missing)));
            assert_eq!(Utf8.encode("t", &"é".to_owned()).await.unwrap(), "é".as_bytes());
            assert_eq!(Raw.decode(Some(&[0, 1, 2])).await.unwrap(), vec![0, 1, 2]);
            assert_eq!(Raw.encode("t", &vec![9]).await.unwrap(), vec![9]);
        })
    }

    #[test]
    fn only_registry_outages_are_transient() {
        assert!(CodecError::RegistryUnavailable { message: "connection refused".into() }.is_transient());
        assert!(!CodecError::UnknownSchema { id: 7 }.is_transient());
        assert!(!CodecError::Missing.is_transient());
        assert!(!CodecError::Invalid { codec: "json", message: "x".into() }.is_transient());
    }

    #[test]
    fn json_reports_type_errors() {
        #[derive(serde::Deserialize, serde::Serialize, Debug)]
        struct Payment {
            #[allow(dead_code)]
            amount: u64,
        }
        let err = block_on(Decode::<Payment>::decode(&Json, Some(br#"{"amount": "ten"}"#))).unwrap_err();
        assert!(err.to_string().starts_with("json: invalid type"), "{err}");
    }
}
